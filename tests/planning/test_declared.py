"""The registry of the strategy language (``autopar/planning/declared.py``): the built-in
families declare through the same call a user's family makes, every mesh axis has one
owner, and a family declared from outside autopar adds a strategy key of its own (its
parse, kind and why_not) without any generic file naming it."""
import json

import pytest

import autopar
from autopar.grid import MeshAxis
from autopar.planning.declared import DECLARED, Language, by_word, declarations, region_owner, registered
from autopar.planning.strategy import PlanError, Strategy
from autopar.strategies.family import CompileHooks
from autopar.strategies.registry import BUILT_IN, FAMILIES, unregister_family


def test_every_family_is_declared_and_every_axis_has_one_owner():
    assert list(DECLARED)[:len(BUILT_IN)] == list(BUILT_IN) == [f.name for f in FAMILIES if f.name in BUILT_IN]
    assert all(DECLARED[name].built_in and registered(name) is None for name in BUILT_IN)
    owners = {axis: [d.name for d in DECLARED.values() if axis in d.axes] for axis in MeshAxis}
    assert {axis: names for axis, names in owners.items() if len(names) != 1} == {}
    assert owners[MeshAxis.SEGMENT] == ["dsp"] and owners[MeshAxis.PIPELINE] == ["pipeline"]
    assert region_owner("cube").name == "cube" and by_word("AxoNN").name == "tensor3d" and by_word("3d").name == "tensor3d" and by_word("ptd-p").name == \
        "pipeline"


def test_one_name_per_family():
    """A built-in family's registered name is its package's, its regions' strategy in
    plan.json, its pin's word and the kind of its forced strategies; its rank pass is
    named so too, where the family has one of its own."""
    for family in FAMILIES[:len(BUILT_IN)]:
        name, declared = family.name, DECLARED[family.name]
        assert type(family).__module__.startswith(f"autopar.strategies.{name}."), (name, type(family).__module__)
        assert set(declared.region_strategies) <= {name}, (name, declared.region_strategies)
        assert declared.pin is None or declared.pin.name == name, (name, declared.pin)
        assert declared.kind in ("", name), (name, declared.kind)


def test_older_spellings_still_read():
    """AxoNN's grid pinned by its older word ``'3d'``, and a plan.json of format 2 whose
    cube regions say ``cube3d``, read as the one name each has now."""
    from autopar.planning.plan import PLAN_FORMAT_VERSION, Plan
    pins = Strategy.parse({"tensor": 4, "regions": {"kind:linear_chain": {"3d": {"x": 2, "y": 2}}}}).regions
    assert [p.family for p in pins] == ["tensor3d"] and pins[0].describe() == "tensor3d 2x2x1"
    import torch
    plan = autopar.plan(torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 8)), 8,
                        (torch.randn(8, 8),), None, {"cube": 2})
    assert {r.strategy for r in plan.regions} >= {"cube"}
    old = json.loads(plan.to_json())
    old["version"] = 2
    old["regions"] = [{**r, "strategy": "cube3d" if r["strategy"] == "cube" else r["strategy"]} for r in old["regions"]]
    loaded = Plan.from_json(json.dumps(old))
    assert loaded.version == PLAN_FORMAT_VERSION and [r.strategy for r in loaded.regions] == \
        [r.strategy for r in plan.regions]
    with pytest.raises(ValueError, match="plan format version 1 is not"):
        Plan.from_json(json.dumps({**old, "version": 1}))
    # a mixed plan of format 2: its candidates' forms said "mixed 3d 2x2"
    from examples.factories import stem_trunk
    model, inputs, loss_fn, target = stem_trunk()
    mixed = autopar.plan(model, 4, inputs, loss_fn, {"data": 1, "tensor": 4, "regions": {
        "kind:attention": "megatron", "kind:linear_chain": {"3d": {"x": 2, "y": 2}}}}, example_target=target)
    assert mixed.form == "mixed tensor3d 2x2" and "chosen" in mixed.why_not("mixed")
    old = json.loads(mixed.to_json())
    old["version"] = 2
    old["candidates"] = [{**c, "form": c["form"].replace("tensor3d", "3d")} for c in old["candidates"]]
    loaded = Plan.from_json(json.dumps(old))
    assert loaded.form == mixed.form and loaded.why_not("mixed") == mixed.why_not("mixed")


def test_mesh_axes_read_as_their_names():
    """A MeshAxis is its value wherever a name was: formatted, compared, hashed, in JSON
    and in messages (repr), so plan.json and the groups' lookups are unchanged."""
    assert f"{MeshAxis.TENSOR_SEG}" == "tensor_seg" and {"data": 1}[MeshAxis.DATA] == 1
    assert json.dumps({MeshAxis.DATA: [MeshAxis.Z]}) == '{"data": ["z"]}'
    assert repr({MeshAxis.X: 2}) == "{'x': 2}" and type(str(MeshAxis.Y)) is str


def test_kind_asks_the_declarations_outer_family_first():
    assert Strategy.parse({"pipeline": 2, "regions": {"kind:attention": "megatron"}}).kind() == "pipeline"
    assert Strategy.parse({"data": 4, "experts": 2}).kind() == "experts"
    assert Strategy.parse({"cube": 2}).kind() == "cube" and Strategy.parse({"x": 2}).kind() == "tensor3d"
    assert [d.name for d in declarations()][:2] == ["experts", "context"]


class _Levelled(CompileHooks):
    name = "levelled"

    def regions(self, model):
        return []

    def candidates(self, ctx):
        return []

    def price(self, ctx, config):
        raise AssertionError("never priced")

    def to_plan(self, ctx, priced):
        raise AssertionError("never planned")


class _LevelledLanguage(Language):
    """A strategy key of its own, ``{"level": n}``, read by the generic parse."""

    name = "levelled"
    keys = ("level",)
    trigger = frozenset({"level"})
    precedence = 5
    absent = "it was not asked for"

    def parse(self, strategy: dict) -> Strategy:
        if set(strategy) != {"level"}:
            raise PlanError(f"strategy: 'level' stands alone, not with {sorted(set(strategy) - {'level'})}")
        return Strategy(family=self.name, family_options=(("level", json.dumps(strategy["level"])),))


@pytest.fixture
def levelled():
    family = autopar.register_family(_Levelled(), language=_LevelledLanguage())
    try:
        yield family
    finally:
        unregister_family("levelled")


def test_a_family_declared_outside_autopar_owns_its_key(levelled):
    forced = Strategy.parse({"level": 3, "zero": 1})
    assert forced.kind() == "levelled" and forced.option("level") == 3 and forced.zero == 1
    with pytest.raises(PlanError, match="'level' stands alone"):
        Strategy.parse({"level": 3, "tensor": 2})
    assert registered("levelled") is DECLARED["levelled"]
    with pytest.raises(ValueError, match="declares the name"):
        autopar.register_family(type("Other", (_Levelled,), {"name": "other"})(), language=_LevelledLanguage())


def test_unregistered_the_key_is_unknown_again(levelled):
    unregister_family("levelled")
    assert "levelled" not in DECLARED
    with pytest.raises(PlanError, match=r"unknown mesh dimension\(s\) \['level'\]"):
        Strategy.parse({"level": 3})
