"""Development tools: the embedded Tansu broker, Apache Kafka launched from Maven Central, and the
scale demo's report."""
