"""The runtime's layers: a module imports only its own layer or lower ones, and no import cycle.

Read from the source with `ast`, so an import inside a function counts as much as one at the top
(it is the same dependency, only paid for later); an import under ``if TYPE_CHECKING:`` does not
(it never runs). `detectorkit/__init__` is exempt: it re-exports a few names lazily.
"""

from __future__ import annotations

import ast
import pathlib

SRC = pathlib.Path(__file__).resolve().parents[1] / "src" / "detectorkit"

# Lowest first. A module is in the first layer one of whose names is the module or a package holding it.
LAYERS = (
    # What every layer shares: logging, and the parsed records with their dead-letter reasons.
    ("base", ("detectorkit.logs", "detectorkit.records")),
    # What a job needs of the platform as Strimzi's resources (topics, its user's rights): written
    # from names alone, so the metrics aggregator and the CLI both print theirs.
    ("manifests", ("detectorkit.manifests",)),
    # Kafka clients, planning, sources and sinks: they know Kafka, nothing of detectors or Spark jobs.
    ("kafka", ("detectorkit.kafka",)),
    # The job's settings read Kafka options from the environment and judge them by kafka's own
    # rules (which keys are secret, the planning minimum), so they sit above kafka.
    ("settings", ("detectorkit.settings",)),
    # Metrics: counted by the runtime, aggregated and reported over Kafka.
    ("metrics", ("detectorkit.metrics",)),
    # A detector's state: declaration, columns, store, changelog and the stateful run of a batch.
    ("state", ("detectorkit.state",)),
    # What a data scientist writes: a detect function, its config and its declared state, or a rule
    # (windows, patterns), or a model to score with (models).
    ("detector", ("detectorkit.detector", "detectorkit.windows", "detectorkit.patterns", "detectorkit.models")),
    # The streaming job that runs a detector (or a stage) on Spark over Kafka.
    ("runtime", ("detectorkit.runtime",)),
    # The services built on the runtime: normaliser, notifier.
    ("roles", ("detectorkit.roles",)),
    # Backtests: a detector over history through the runtime's stage, without the streaming job.
    ("backtest", ("detectorkit.backtest",)),
    # Development and test helpers: sample records, the harness for tests, local brokers and clusters.
    ("tools", ("detectorkit.samples", "detectorkit.testing", "detectorkit.pytest_plugin", "detectorkit.devtools")),
    # The command line: sees everything.
    ("cli", ("detectorkit.cli", "detectorkit.__main__")),
)
EXEMPT = {"detectorkit"}
# Who may import devtools (local brokers, clusters, pacing): the CLI, the pytest plugin, devtools.
SEES_DEVTOOLS = ("detectorkit.cli", "detectorkit.devtools", "detectorkit.pytest_plugin")


def _module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in sorted(SRC.rglob("*.py"))}


def _within(name: str, prefixes) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def layer_of(name: str) -> int:
    for index, (_, prefixes, *_) in enumerate(LAYERS):
        if _within(name, prefixes):
            return index
    raise AssertionError(f"{name} is in no layer: add it to test_layers.LAYERS")


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _resolve(target: str) -> str | None:
    """The detectorkit module an import names: the longest module prefix of `target`."""
    while target and target not in MODULES:
        target = target.rpartition(".")[0]
    return target or None


class _Imports(ast.NodeVisitor):
    def __init__(self, name: str, is_package: bool):
        self.package = name if is_package else name.rpartition(".")[0]
        self.found: set[str] = set()

    def visit_If(self, node: ast.If) -> None:
        if _is_type_checking(node.test):
            for child in node.orelse:
                self.visit(child)
        else:
            self.generic_visit(node)

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if alias.name.split(".")[0] == "detectorkit":
                self._add(alias.name)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level:
            base = self.package.split(".")[: len(self.package.split(".")) - (node.level - 1)]
            origin = ".".join([*base, *([node.module] if node.module else [])])
        else:
            origin = node.module or ""
        if origin.split(".")[0] != "detectorkit":
            return
        for alias in node.names:
            # `from detectorkit.kafka import clients` imports the module detectorkit.kafka.clients.
            self._add(f"{origin}.{alias.name}" if f"{origin}.{alias.name}" in MODULES else origin)

    def _add(self, target: str) -> None:
        module = _resolve(target)
        if module is not None:
            self.found.add(module)


def _imports() -> dict[str, set[str]]:
    graph = {}
    for name, path in MODULES.items():
        visitor = _Imports(name, path.name == "__init__.py")
        visitor.visit(ast.parse(path.read_text(), str(path)))
        graph[name] = visitor.found - {name}
    return graph


GRAPH = _imports()


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in sorted(graph[node]):
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_imports_are_read():
    """Guards the rest against passing on an empty graph: known arrows, a function-level and a
    relative-free `from package import module` one among them."""
    assert "detectorkit.kafka.clients" in GRAPH["detectorkit.kafka.offset_store"]  # from detectorkit.kafka import clients
    assert "detectorkit.runtime.jvm" in GRAPH["detectorkit.cli.main"]  # inside a function
    assert "detectorkit.detector" not in GRAPH["detectorkit"]  # under `if TYPE_CHECKING:`
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_every_module_has_a_layer():
    for name in MODULES:
        if name not in EXEMPT:
            layer_of(name)


def test_no_import_cycle():
    cycles = _cycles(GRAPH)
    assert not cycles, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def test_no_module_imports_a_higher_layer():
    upward = [
        f"{name} ({LAYERS[layer_of(name)][0]}) imports {target} ({LAYERS[layer_of(target)][0]})"
        for name, targets in sorted(GRAPH.items())
        if name not in EXEMPT
        for target in sorted(targets)
        if target not in EXEMPT and layer_of(target) > layer_of(name)
    ]
    assert not upward, "imports of a higher layer:\n" + "\n".join(upward)


def test_only_the_cli_sees_devtools():
    seen = [
        f"{name} imports {target}"
        for name, targets in sorted(GRAPH.items())
        if not _within(name, SEES_DEVTOOLS)
        for target in sorted(targets)
        if _within(target, ("detectorkit.devtools",))
    ]
    assert not seen, "devtools outside the CLI and the test helpers:\n" + "\n".join(seen)


# One concern per module; the driver's functions each a step one reads at once.
MODULE_LINES, RUNTIME_FUNCTION_LINES = 500, 60


def test_no_module_grows_past_its_concern_nor_a_runtime_function_past_a_screen():
    long_modules = [f"{p.relative_to(SRC)}: {n} lines" for p in sorted(SRC.rglob("*.py")) if (n := len(p.read_text().splitlines())) > MODULE_LINES]
    long_functions = [
        f"runtime/{p.name}:{node.lineno} {node.name}: {node.end_lineno - node.lineno + 1} lines"
        for p in sorted((SRC / "runtime").glob("*.py"))
        for node in ast.walk(ast.parse(p.read_text()))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.end_lineno - node.lineno + 1 > RUNTIME_FUNCTION_LINES
    ]
    assert not long_modules and not long_functions, "\n".join(long_modules + long_functions)
