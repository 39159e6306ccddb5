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
    assert region_owner("cube3d").name == "cube" and by_word("AxoNN").name == "3d" and by_word("ptd-p").name == \
        "pipeline"


def test_mesh_axes_read_as_their_names():
    """A MeshAxis is its value wherever a name was: formatted, compared, hashed, in JSON
    and in messages (repr), so plan.json and the groups' lookups are unchanged."""
    assert f"{MeshAxis.TENSOR_SEG}" == "tensor_seg" and {"data": 1}[MeshAxis.DATA] == 1
    assert json.dumps({MeshAxis.DATA: [MeshAxis.Z]}) == '{"data": ["z"]}'
    assert repr({MeshAxis.X: 2}) == "{'x': 2}" and type(str(MeshAxis.Y)) is str


def test_kind_asks_the_declarations_outer_family_first():
    assert Strategy.parse({"pipeline": 2, "regions": {"kind:attention": "megatron"}}).kind() == "pipeline"
    assert Strategy.parse({"data": 4, "experts": 2}).kind() == "experts"
    assert Strategy.parse({"cube": 2}).kind() == "cube" and Strategy.parse({"x": 2}).kind() == "3d"
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
