// Reads Kubernetes YAML documents on stdin and validates each Strimzi resource against the schema of
// its kind and version; prints one line per refusal and exits 1 if there was any.
import { readFileSync } from "node:fs";
import { loadAll } from "js-yaml";

const docs = loadAll(readFileSync(0, "utf8")).filter(Boolean);
let refused = 0;
for (const doc of docs) {
  const [group, version] = doc.apiVersion.split("/");
  if (!group.endsWith("strimzi.io")) continue;
  const models = await import(`@kubernetes-models/strimzi-kafka-operator/${group}/${version}`);
  const Kind = models[doc.kind];
  if (Kind === undefined) {
    console.log(`${doc.kind} ${doc.metadata?.name}: no such kind in ${doc.apiVersion}`);
    refused++;
    continue;
  }
  try {
    new Kind(doc).validate();
    console.log(`${doc.kind} ${doc.metadata.name}: valid`);
  } catch (error) {
    console.log(`${doc.kind} ${doc.metadata?.name}: ${error.message}`);
    refused++;
  }
}
process.exit(refused ? 1 : 0);
