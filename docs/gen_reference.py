"""Writes the generated pages into the site as it builds (mkdocs-gen-files): the settings, the command
line and the metrics from the code (detectorkit.cli.reference), the changelog, and the benchmarks'
results pages and charts as `make bench*` wrote them (bench/results/)."""

import pathlib

import mkdocs_gen_files

from detectorkit.cli import reference

for name, text in reference.pages().items():
    with mkdocs_gen_files.open(f"reference/{name}", "w") as page:
        page.write(text)
    mkdocs_gen_files.set_edit_path(f"reference/{name}", "../detectorkit/src/detectorkit/cli/reference.py")

with mkdocs_gen_files.open("changelog.md", "w") as page:
    page.write(pathlib.Path("CHANGELOG.md").read_text())

# The benchmarks' charts, as each run drew them (bench/results/<run>/*.png), for the benchmarks page.
for chart in sorted(pathlib.Path("bench/results").rglob("*.png")):
    with mkdocs_gen_files.open(f"bench-results/{chart.relative_to('bench/results')}", "wb") as image:
        image.write(chart.read_bytes())

# Each benchmark's own results page, as its command wrote it (the benchmarks page links them), its
# charts beside it.
RESULTS = {
    "latest.md": "bench/results/latest.md",
    "stateful.md": "bench/results/stateful.md",
    "model.md": "bench/results/model.md",
    "model-window-60s.md": "bench/results/model-window-60s/model.md",
    "model-parts.md": "bench/results/model-parts.md",
    "model-window-60s-parts.md": "bench/results/model-window-60s/model-parts.md",
    "exactly-once-5m.md": "bench/results/exactly-once-5m/latest.md",
    "stores.md": "bench/results/stores.md",
    "backtest-rules.md": "bench/results/backtest-rules.md",
}
for name, source in RESULTS.items():
    text = pathlib.Path(source).read_text()
    folder = pathlib.Path(source).parent.relative_to("bench/results")
    if str(folder) != ".":
        text = text.replace("](throughput.png)", f"]({folder}/throughput.png)").replace("](latency.png)", f"]({folder}/latency.png)")
    with mkdocs_gen_files.open(f"bench-results/{name}", "w") as page:
        page.write(text)
    mkdocs_gen_files.set_edit_path(f"bench-results/{name}", f"../{source}")
