"""A run's backbone config is its architecture's own dataclass (:attr:`sesame.run.RunConfig.model`): parsed once from
config.json, written back as the same JSON, and changed only with ``dataclasses.replace``. Outside ``sesame/models/``
(which parses the dicts) and ``sesame/interop/`` (which converts transformers' configs), no code treats a run config's
``model`` as a dict, re-parses it or edits it in place: the source is read (AST) for that, below."""
from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from sesame.errors import SesameError
from sesame.models import TransformerConfig
from sesame.run import RunConfig, read_config

from .test_backbone_contract import ALL

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures" / "runs"
OWN_DICTS = (ROOT / "sesame" / "models", ROOT / "sesame" / "interop")  # where config dicts are parsed and converted
SCANNED = [path for folder in ("sesame", "scripts", "benchmarks") for path in sorted((ROOT / folder).rglob("*.py"))
           if not any(path.is_relative_to(own) for own in OWN_DICTS)]
DICT_METHODS = {"get", "update", "setdefault", "pop", "popitem", "items", "keys", "values", "copy", "clear"}


def returns_run_configs(trees: list[ast.Module]) -> dict[str, tuple[int, ...] | None]:
    """The functions whose annotation says they return a RunConfig: name → the positions of the tuple they return
    that hold one (None: the value itself is one)."""
    found: dict[str, tuple[int, ...] | None] = {}
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.returns is not None:
                returned = node.returns
                if isinstance(returned, ast.Subscript) and ast.unparse(returned.value) == "tuple":
                    items = returned.slice.elts if isinstance(returned.slice, ast.Tuple) else [returned.slice]
                    positions = tuple(i for i, item in enumerate(items) if "RunConfig" in ast.unparse(item))
                    if positions:
                        found[node.name] = positions
                elif "RunConfig" in ast.unparse(returned):
                    found[node.name] = None
    return found


def called(node: ast.AST) -> str | None:
    """The name of the function a call calls (``f(...)``, ``x.f(...)``), else None."""
    if isinstance(node, ast.Call):
        return node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", None)
    return None


class RunConfigs:
    """Which expressions of one scope (a module or a function, nested ones included) are RunConfigs: a name annotated
    so, or bound to one (``RunConfig(...)``, ``replace(<one>, ...)``, a call of a function annotated to return one, as
    ``read_config``, or one of the tuple it returns), and any ``<x>.config`` (a source's, a predictor's, a teacher's: a
    TrainConfig or a model config has no ``model``). A name bound to a RunConfig's ``model`` is followed too
    (``aliases``: ``m = config.model; m["layers"]``)."""

    def __init__(self, scope: ast.AST, makers: dict[str, tuple[int, ...] | None]):
        self.makers, self.names, self.aliases = makers, set(), set()
        arguments = [a for node in ast.walk(scope) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                     for a in node.args.args + node.args.kwonlyargs + node.args.posonlyargs]
        self.names |= {a.arg for a in arguments if a.annotation is not None and self.typed(a.annotation)}
        for _ in range(2):  # a name bound from another that is bound later in the text
            for node in ast.walk(scope):
                if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and (
                        self.typed(node.annotation) or node.value is not None and self.holds(node.value)):
                    self.names.add(node.target.id)
                elif isinstance(node, ast.Assign):
                    for target in node.targets:
                        self.bind(target, node.value)

    @staticmethod
    def typed(annotation: ast.AST) -> bool:
        return "RunConfig" in ast.unparse(annotation)

    def bind(self, target: ast.AST, value: ast.AST) -> None:
        if isinstance(target, ast.Name) and self.holds(value):
            self.names.add(target.id)
        elif isinstance(target, ast.Name) and self.model(value):
            self.aliases.add(target.id)
        elif isinstance(target, ast.Tuple) and isinstance(value, ast.Tuple):
            for t, v in zip(target.elts, value.elts):
                self.bind(t, v)
        elif isinstance(target, ast.Tuple) and self.makers.get(called(value)):
            for i in self.makers[called(value)]:
                if i < len(target.elts) and isinstance(target.elts[i], ast.Name):
                    self.names.add(target.elts[i].id)

    def holds(self, node: ast.AST) -> bool:
        """Whether ``node`` evaluates to a RunConfig."""
        if isinstance(node, ast.Name):
            return node.id in self.names
        if isinstance(node, ast.Attribute):
            return node.attr == "config"
        if isinstance(node, ast.BoolOp):
            return any(self.holds(v) for v in node.values)
        if isinstance(node, ast.IfExp):
            return self.holds(node.body) or self.holds(node.orelse)
        name = called(node)
        if name == "replace":
            return bool(node.args) and self.holds(node.args[0])
        return name == "RunConfig" or name in self.makers and self.makers[name] is None

    def model(self, node: ast.AST) -> bool:
        """Whether ``node`` is ``<a RunConfig>.model``, or a name bound to one."""
        if isinstance(node, ast.Name):
            return node.id in self.aliases
        return isinstance(node, ast.Attribute) and node.attr == "model" and self.holds(node.value)


def dict_uses(source: str, makers: dict[str, tuple[int, ...] | None]) -> list[str]:
    """``line: code`` of every place ``source`` reads a RunConfig's ``model`` as a dict (``[...]``, ``.get`` and the
    other dict methods, ``in``, ``**``, ``dict(...)``), parses it again, or changes it in place (assigns it or one of
    its fields) instead of making a new config with ``dataclasses.replace``."""
    tree = ast.parse(source)
    scopes = [tree] + [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    found: set[int] = set()
    for scope in scopes:
        configs = RunConfigs(scope, makers)
        for node in ast.walk(scope):
            wrong = (
                isinstance(node, ast.Subscript) and configs.model(node.value)
                or isinstance(node, ast.Attribute) and node.attr in DICT_METHODS and configs.model(node.value)
                or isinstance(node, ast.Compare) and any(isinstance(op, (ast.In, ast.NotIn)) for op in node.ops)
                and any(configs.model(c) for c in node.comparators)
                or isinstance(node, ast.Dict) and any(k is None and configs.model(v)
                                                      for k, v in zip(node.keys, node.values))
                or isinstance(node, ast.Call) and (any(k.arg is None and configs.model(k.value) for k in node.keywords)
                                                   or called(node) in ("dict", "model_config")
                                                   and any(configs.model(a) for a in node.args))
                or isinstance(node, (ast.Assign, ast.AugAssign)) and any(
                    configs.model(t) and not isinstance(t, ast.Name)  # binding an alias is no edit
                    or isinstance(t, ast.Attribute) and configs.model(t.value)
                    for t in (node.targets if isinstance(node, ast.Assign) else [node.target])))
            if wrong:
                found.add(node.lineno)
    return [f"{n}: {source.splitlines()[n - 1].strip()}" for n in sorted(found)]


@pytest.fixture(scope="module")
def makers() -> dict[str, tuple[int, ...] | None]:
    return returns_run_configs([ast.parse(p.read_text()) for p in sorted((ROOT / "sesame").rglob("*.py"))])


def test_no_code_outside_models_and_interop_reads_a_backbone_config_as_a_dict(makers):
    found = {str(p.relative_to(ROOT)): uses for p in SCANNED if (uses := dict_uses(p.read_text(), makers))}
    assert found == {}


def test_the_scan_finds_dict_access_and_in_place_edits_of_a_run_config_s_model(makers):
    assert "tuple" not in str(makers) and makers["read_config"] is None and makers["starting_point"] == (0,)
    source = '''
def plan(source, spec):
    config, tok = starting_point(source, spec)
    config.model.update(dropout=0.0)
    arch = config.model.get("arch", "transformer")
    return {**config.model, "layers": 2}

def teacher(self, run, given: RunConfig | None):
    config = given or read_config(run, "--teacher")
    config.model = {"vocab_size": 3}
    config.model.dropout = 0.0
    if "mem_len" in config.model:
        return self.config.model["layers"], model_config(config.model), dict(read_config(run, "--model").model)

def alias(config: RunConfig):
    model = config.model
    model["layers"] = 2
    return model.get("hidden")
'''
    assert [line.split(":")[0] for line in dict_uses(source, makers)] == ["4", "5", "6", "10", "11", "12", "13", "17",
                                                                          "18"]


def test_the_scan_leaves_other_models_and_typed_access_alone(makers):
    source = '''
def serve(self, spec, config: RunConfig, batch):
    positions = config.model.max_positions  # typed
    model = replace(config.model, dropout=0.0)  # a new config
    outputs = self.model(batch)  # a task model, not a config
    tokens = sum(self.model.task.length(f) for f in batch["features"])
    rows = spec.model["rows"]  # a spec's, not a run config's
    return {**model.to_dict(), "path": spec.model}
'''
    assert dict_uses(source, makers) == []


@pytest.mark.parametrize("run", ["pretrained", "classifier"])
def test_a_run_s_model_is_parsed_once_into_its_architecture_s_config(run):
    config = read_config(FIXTURES / run, "--model")
    assert type(config.model) is TransformerConfig and config.model.arch == "transformer"
    written = json.loads((FIXTURES / run / "config.json").read_text())["model"]
    moved = {"adapter_size", "scalar_mix"}  # the run's additions now (sesame.models.additions), out of its model
    assert config.to_json()["model"] == {k: v for k, v in written.items() if k not in moved}  # as read: no defaults
    assert "norm_kind" not in written and config.model.norm_kind == "layer"  # a field added since: its default


@ALL
def test_config_json_keeps_its_model_json(case):
    """Written, read and written again, a run's config.json is the same text: ``arch`` where the architecture has one
    as a field (none for a Transformer's, as runs always wrote it), the fields in the dataclass's order."""
    text = json.dumps(RunConfig(kind="pretrained", family="bert", model=case.config).to_json())
    again = RunConfig.parse(json.loads(text), "config.json")
    assert type(again.model) is type(case.config) and again.model == case.config and again.model.arch == case.arch
    assert json.dumps(again.to_json()) == text and ("arch" in json.loads(text)["model"]) == (case.arch != "transformer")


@pytest.mark.parametrize("model, message", [
    ({"vocab_size": 8, "colour": "red"}, "unexpected keyword argument 'colour'"),
    ({"arch": "lstm", "vocab_size": 8}, "'lstm'"),
    ({"vocab_size": 8, "hidden": 10, "heads": 4}, "hidden 10 is not divisible by heads 4"),
    ({"hidden": 8}, "missing 1 required positional argument: 'vocab_size'")])
def test_a_model_config_that_describes_no_backbone_is_refused_in_one_line(model, message):
    with pytest.raises(SesameError, match=f"config.json: its model config does not describe a backbone .*{message}"):
        RunConfig.parse({"kind": "pretrained", "family": "bert", "model": model}, "config.json")
