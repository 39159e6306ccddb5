"""A rank's stages of a pipeline plan (PTD-P, megatron §2-§4): :class:`PipelineRunner`.

The :class:`~autopar.engine.module.ParallelModule` of a plan with a ``pipeline`` runs through
it. A rank at pipeline position
``r`` holds only the parameters its stages read (stages ``c·p + r``, or ``r`` and
``2p − 1 − r`` under ZB-V: :func:`autopar.planning.schedules.stages_of`); the others are
empty on it. ``step`` splits its data rank's share of the batch into ``m`` microbatches,
runs the schedule (:class:`autopar.strategies.pipeline.executor.PipelineExecutor`), and:

* averages the gradients over the data ranks, bucket by bucket, once each: before a
  stage's last backward of the step the runner *arms* its parameters, so a bucket
  launches as soon as every parameter in it has its last microbatch's gradient, while
  the remaining backwards run (the overlap of Megatron's data-parallel all-reduce);
  what is left launches after the schedule. Under ZeRO-1/2 the buckets hold the full
  copies, which are not armed: they reduce after the schedule;
* sums the gradients of a weight that several stages read (GPT-2's tied embedding and
  head) over the ranks of those stages, as Megatron's embedding group does;
* returns the whole batch's loss on every rank (reduced over the data ranks on the last
  stage, broadcast over the pipeline group).

The loss is ``loss_fn``'s or, without one, the model's own (keyword inputs such as
``labels=`` are graph inputs like positional ones and split into microbatches alike). A
mean over counted targets (cross-entropy with ``ignore_index``) is divided by the count
of the whole batch, over every microbatch and data rank, so padding that differs
between microbatches changes nothing (:mod:`autopar.runtime.target_count`).

Each stage's program is built from the graph captured at the microbatch's shape: the
graph is cut into stages (:func:`autopar.strategies.pipeline.stages.split`), each stage is
analysed with its part of the whole graph's vocab region (a tied embedding and head
span the first and last stages), and each of this rank's stages is rewritten by every
family's passes for its own regions (Megatron inside a PTD-P stage; D&SP, Megatron or
a 3D grid per region in a stage of a mixed plan, ``docs/mixed_plans.md``) and, with
``recompute``, its blocks are recomputed in backward (megatron §3.5).
"""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.fx as fx
import torch.nn as nn

from autopar.grid import MeshAxis
from autopar.trace.inputs import signature
from autopar.engine.executable import batch_of, executable, local_batch, microbatches, rank_graph_code
from autopar._torch_compat import export_out_spec
from autopar.trace.capture import capture
from autopar.trace.inputs import CallLayout
from autopar.ir import CAPTURE, LAST, PARAM_SHARDS, PASSES_RUN, STAGE, Region, add_region, clear_regions, regions
from autopar.passes.analysis.analyse import analyse
from autopar.passes.analysis.naming import adopt_region_ids
from autopar.strategies.shared.outputs import loss_reduction, mark_batch_major_rows
from autopar.passes.fusion.rewrite import fusion_pass
from autopar.passes.manager import PassRunner
from autopar.strategies.pipeline.stages import split
from autopar.passes.recompute import recompute_pass
from autopar.strategies.family import StageCut
from autopar.planning.schedules import rank_of, stages_of
from autopar.planning.strategy import PlanError
from autopar.runtime import devices, groups as G
from autopar.strategies.pipeline.executor import PipelineExecutor, StageProgram
from autopar.runtime.target_count import use_target_count
from autopar.trace.capture import layout_name
from autopar.runtime.family_runtime import RankRuntime


def stage_blocks_pass(gm: fx.GraphModule, *, block_nodes: dict[str, list[str]],
                      region_ids: dict[tuple[str, str], str] | None = None) -> fx.GraphModule:
    """Mark the stage's blocks as the whole graph's analysis found them: a stage of one
    block has no repetition of its own for the analysis to find, and recomputation goes
    block by block. The stage's other regions take the whole graph's ids (``region_ids``:
    ``(kind, first node name) -> id``; the plan names them so), which the stage's own
    analysis can number otherwise: ``linear_chain:enc#1`` is the first chain of ``enc``
    in a stage without the other (:func:`autopar.passes.analysis.naming.adopt_region_ids`)."""
    if region_ids:
        adopt_region_ids(gm, region_ids)
    present = {r.id for r in regions(gm, "block")}
    if not present <= set(block_nodes):  # the stage's own stack read otherwise (a period seen in part): the cut's
        clear_regions(gm, "block")
        present = set()
    names = {n.name for n in gm.graph.nodes}
    for rid, nodes in block_nodes.items():
        if rid not in present:
            add_region(gm, Region(rid, "block", [n for n in nodes if n in names], {"from": "pipeline cut"}))
    return gm


def _stage_cut(index: int, block_nodes: dict[str, list[str]], region_ids: dict[tuple[str, str], str] | None,
               vocab: list[Region]) -> StageCut:
    """Stage ``index``'s cut of the graph, as ``rewrite`` (:func:`autopar.driver.rank_program.rewrite`,
    ``stage=``) builds its program: the within-stage passes of the plan, every family
    adding the passes of its regions in this stage (:meth:`~autopar.strategies.family.Family.rank_passes`
    with ``RankBuild.stage``): Megatron inside a PTD-P stage, and in a mixed pipeline
    D&SP, Megatron or a 3D grid per region; the data-parallel pass on the last stage
    only, over microbatches. With ``recompute`` the stage's blocks (``block_nodes``)
    recompute (megatron §3.5); its blocks and regions take the whole graph's ids first
    (:func:`stage_blocks_pass`)."""
    return StageCut(index, block_nodes, vocab=tuple(vocab),
                    passes=(("stage_blocks", stage_blocks_pass, {"block_nodes": block_nodes, "region_ids": region_ids}),))


def stage_graphs(model: nn.Module, plan_, rank: int, inputs: tuple, loss_fn=None, target=None,
                 recompute: bool | str = False, fusion: bool = False, *, rewrite, layout: CallLayout | None = None,
                 model_loss: str | None = None, zero_params: dict | None = None, check=None):
    """Rank ``rank``'s stage programs for (micro)batches shaped like ``inputs``, each
    rewritten by ``rewrite`` (:func:`autopar.driver.rank_program.rewrite`):
    ``({stage: (GraphModule, Stage)}, graph input names, torch.export's output nesting)``.
    Captured here, cut into the plan's stages, each of the rank's stages rewritten.
    ``inputs``: flat, laid out by ``layout`` (positional, then keyword tensors);
    ``model_loss``: as :func:`autopar.trace.capture.capture` (the model's own loss);
    ``check``: called with the capture before it is cut."""
    args, kwargs = (layout or CallLayout(len(inputs))).unflatten(inputs)
    gm = analyse(capture(model, args, loss_fn if target is not None else None, target, example_kwargs=kwargs,
                         model_loss=None if loss_fn is not None else model_loss))
    if check is not None:
        check(gm)
    names = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
    # torch.export's graph returns flat outputs its code generator nests again
    out_spec = export_out_spec(gm)
    pp = plan_.pipeline
    p = pp["stages"]
    rows = batch_of(tuple(inputs))
    mark_batch_major_rows(gm, rows)   # outputs a later stage receives from an earlier one
    stages = split(gm, p * pp["chunks"], pp["assignment"])
    region_ids = {(r.kind, r.nodes[0]): r.id for r in regions(gm) if r.kind != "block" and r.nodes}
    vocab = regions(gm, "vocab")
    position = plan_.rank_coordinates(rank)[MeshAxis.PIPELINE]
    out = {}
    for s in stages_of(pp["schedule"], p, pp["chunks"], position):
        stage = stages[s]
        stage.module.meta[STAGE] = s
        last = s == len(stages) - 1
        module = rewrite(stage.module, plan_, rank, rows, recompute, fusion, zero_params,
                         stage=_stage_cut(s, stage.block_nodes, region_ids, vocab))
        module.meta[LAST] = last
        out[s] = (module, stage)
    return out, names, out_spec


def pipeline_rank_code(model: nn.Module, plan_, rank: int, example_inputs, loss_fn=None,
                       example_target=None, *, rewrite, example_kwargs=None, zero_params: dict | None = None) -> str:
    """Rank ``rank``'s stage programs as code (for plan dumps), captured at one
    microbatch of its data rank's share of the batch, each rewritten by ``rewrite``
    (:func:`autopar.driver.rank_program.rewrite`)."""
    m = plan_.pipeline["microbatches"]
    layout = CallLayout.of(example_inputs, example_kwargs)
    flat = layout.flatten(tuple(example_inputs), dict(example_kwargs or {}), "the example")
    inputs, target = local_batch(plan_.batch_parts(), plan_.batch_chunk(rank), flat, example_target)
    batch = batch_of(inputs)
    piece = microbatches((*inputs, target), m, batch)[0]
    built, _, _ = stage_graphs(model, plan_, rank, piece[:-1], loss_fn, piece[-1], fusion=plan_.fusion,
                               rewrite=rewrite, layout=layout, model_loss="if_present", zero_params=zero_params)
    return "\n".join(_stage_code(rank_graph_code(module, plan_, rank), s, rank) for s, (module, _) in sorted(built.items()))


def _stage_code(code: str, stage: int, rank: int) -> str:
    return code.replace(f"# rank {rank} of", f"# stage {stage} on rank {rank} of", 1)


class PipelineRunner:
    """Runs this rank's stages of a pipeline plan for :class:`autopar.engine.module.ParallelModule`
    (module docstring): the stage programs per input signature, the schedule
    (:class:`~autopar.strategies.pipeline.executor.PipelineExecutor`), the gradient
    synchronisation after the last microbatch and the loss on every rank."""

    def __init__(self, state, model: nn.Module):
        self.state = state
        plan = state.plan
        pp = plan.pipeline
        self.p, self.v, self.m = pp["stages"], pp["chunks"], pp["microbatches"]
        self.position = plan.rank_coordinates(state.rank)[MeshAxis.PIPELINE]
        self.last = rank_of(pp["schedule"], self.p, self.p * self.v - 1)  # the pipeline rank of the last stage
        self.parts, self.chunk = plan.batch_parts(), plan.batch_chunk(state.rank)
        self.executor = PipelineExecutor(self.p, self.v, self.position,
                                         dist.get_process_group_ranks(state.groups[MeshAxis.PIPELINE]), pp["schedule"],
                                         pp["scatter_gather"])
        self.programs: dict[tuple, tuple[dict[int, StageProgram], list[str]]] = {}
        self.executor.before_last_backward = self._arm
        self.dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)
        # the parameters whose gradient is summed over the positions that read them
        tied = {}
        for name, param in state.root.named_parameters():
            placement = state.layout.get(layout_name(name))
            if placement is not None and placement.held and placement.tied:
                tied[id(param)] = (param, placement.tied)
        self.tied = list(tied.values())

    # ------------------------------------------------------------------ programs
    def stage_programs(self, inputs: tuple, target, training: bool, loss: bool = False
                       ) -> tuple[dict[int, StageProgram], list[str]]:
        """This rank's stage programs for (micro)batches shaped like ``inputs`` (flat), and
        the names of the graph inputs in order; ``loss``: the training programs."""
        state = self.state
        key = ("pipeline", tuple(signature(x) for x in inputs), signature(target), loss, training)
        if key not in self.programs:
            with state.building(f"its {'training ' if loss else ''}stage programs"):
                self.programs[key] = self._build(inputs, target, training, loss)
        return self.programs[key]

    def _build(self, inputs: tuple, target, training: bool, loss: bool) -> tuple[dict[int, StageProgram], list[str]]:
        """This rank's stage programs: captured, cut, rewritten and made executable."""
        state = self.state
        built, names, out_spec = state.build(inputs, target, training, lambda: stage_graphs(
            state.user_model, state.plan, state.rank, inputs, state.loss_fn, target, state.recompute,
            state.fusion, rewrite=state.rewrite, layout=state.call, model_loss="required" if loss else None,
            check=lambda gm: state.check_scalars(gm, state.plan.global_batch, batch_of(tuple(inputs)), training),
            **state.rewrite_options()), explain_shapes=False)
        programs = {}
        for s, (module, stage) in built.items():
            for name, shard in module.meta.get(PARAM_SHARDS, {}).items():
                if state.shards.get(name) != shard:
                    raise RuntimeError(f"stage {s} splits {name} otherwise than the plan did; this is a bug")
            program = executable(module, state.root, f"Rank{state.rank}Stage{s}", state.torch_compile)
            programs[s] = StageProgram.of(s, program, len(stage.receives), stage.inputs, module.meta[LAST],
                                          out_spec)
        return programs, names

    def graph_inputs_read(self) -> set[str] | None:
        """The graph inputs this rank's stage programs read (their names), None before
        the first call builds them."""
        if not self.programs:
            return None
        programs, _ = list(self.programs.values())[-1]
        return {name for program in programs.values() for name in program.inputs}

    def code(self) -> str:
        """This rank's most recent stage programs as readable code."""
        if not self.programs:
            raise RuntimeError("no program built yet: call the model or step() first")
        programs, _ = list(self.programs.values())[-1]
        return "\n".join(_stage_code(rank_graph_code(p.module, self.state.plan, self.state.rank), s, self.state.rank)
                         for s, p in sorted(programs.items()))

    # ------------------------------------------------------------------ running
    def _last_stage_count(self, programs: dict[int, StageProgram], pieces: list[tuple]) -> torch.Tensor | None:
        """The whole batch's count of counted targets when the last stage (on this rank)
        averages its loss over them: see :meth:`autopar.engine.runner.RankState.target_count`."""
        last = programs.get(self.p * self.v - 1)
        return None if last is None else self.state.target_count(last.module, pieces, MeshAxis.DATA)

    def forward(self, flat: tuple, training: bool):
        state = self.state
        local_inputs, _ = state.share(self.parts, self.chunk, flat, None)
        programs, names = self.stage_programs(local_inputs, None, training)
        count = self._last_stage_count(programs, [local_inputs])
        state.begin(stage=True)
        rows = batch_of(local_inputs) or 0
        self.executor.rows = (self.chunk * rows, rows, rows * self.parts)
        with state.running(stage=True), use_target_count(count):
            out = self.executor.forward_only(programs, dict(zip(names, local_inputs)))
            box = [out]
            dist.broadcast_object_list(box, group=G.get_group(MeshAxis.PIPELINE), group_src=self.last)
        state.finish()
        return devices.to_rank_device(box[0], state.device)   # unpickled on the sender's device

    def prepare(self, flat: tuple, target, training: bool) -> None:
        """Build the stage programs a ``step`` on ``flat`` runs, without running them (what
        ``compile`` does with the example)."""
        local_inputs, local_target = self.state.share(self.parts, self.chunk, flat, target)
        batch = batch_of(local_inputs)
        if batch is None or batch % self.m:
            return   # the step says why
        pieces = microbatches((*local_inputs, local_target), self.m, batch)
        self.stage_programs(pieces[0][:-1], pieces[0][-1], training, loss=True)

    def step(self, flat: tuple, target, training: bool):
        """Forward and backward of every microbatch in the schedule's order; gradients
        synchronised after the last; returns the whole batch's loss on every rank."""
        state = self.state
        local_inputs, local_target = state.share(self.parts, self.chunk, flat, target)
        batch = batch_of(local_inputs)
        m = self.m
        if batch is None or batch % m:
            raise PlanError(f"step(): the batch of each data rank ({batch}) is not divisible by the {m} microbatches "
                            f"of the plan; give a batch that is a multiple of "
                            f"{m * (1 if state.batch_local else self.parts)}, or plan with another "
                            f"'microbatches'")
        pieces = microbatches((*local_inputs, local_target), m, batch)
        programs, names = self.stage_programs(pieces[0][:-1], pieces[0][-1], training, loss=True)
        summed = self._loss_summed(programs)
        count = self._last_stage_count(programs, pieces)
        data = self.parts
        # every microbatch's loss is a mean over its rows: 1/m of each is the batch's mean;
        # a summed loss needs no scale, but the data average divides by d (as in step())
        scale = float(data) if summed and data > 1 else (1.0 if summed else 1.0 / m)
        self.executor.rows = (self.chunk * batch, batch // m, batch * self.parts)
        state.begin(stage=True)
        with state.running(stage=True), use_target_count(count):
            losses = self.executor.train(programs, [dict(zip(names, piece)) for piece in pieces], scale)
            state.finish_buckets()
            state.finish()
            for p, group_name in self.tied:
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
                dist.all_reduce(p.grad, group=G.get_group(group_name))
            loss = torch.zeros((), dtype=torch.float64, device=devices.current())
            if losses:
                loss = torch.stack([x.double() for x in losses]).sum() / (1 if summed else m)
                if data > 1:
                    dist.all_reduce(loss, group=G.get_group(MeshAxis.DATA))
                    loss = loss if summed else loss / data
            dist.broadcast(loss, group=G.get_group(MeshAxis.PIPELINE), group_src=self.last)
        return loss.to(self.dtype)

    def _arm(self, params: list) -> None:
        """Before the action after which ``params`` have their last gradient of the step:
        the data buckets may launch them as they are ready."""
        for buckets in self.state.buckets.values():
            buckets.arm(params)

    def _loss_summed(self, programs: dict[int, StageProgram]) -> bool:
        """Whether the loss sums over the batch, read off the last stage's output node
        (False on the other ranks: only the last stage scales a loss)."""
        last = programs.get(self.p * self.v - 1)
        if last is None:
            return False
        output = next(n for n in last.module.graph.nodes if n.op == "output")
        value = output.args[0]
        if isinstance(value, (tuple, list)) and len(value) == 1:  # torch.export's flat outputs
            value = value[0]
        return isinstance(value, fx.Node) and loss_reduction(value) == "sum"


class PipelineRankRuntime(RankRuntime):
    """The pipeline on a rank (:class:`~autopar.runtime.family_runtime.RankRuntime`): its
    :class:`PipelineRunner` in place of the single-program runner, and
    ``pm.pipeline_executor``, the schedule runner of the last step. Active under a
    pipeline plan."""

    name = "pipeline"

    def __init__(self, plan):
        self.active = bool(plan.pipeline)
        self._runner: PipelineRunner | None = None

    def runner(self, state, model) -> PipelineRunner:
        self._runner = PipelineRunner(state, model)
        return self._runner

    def attributes(self) -> dict:
        return {"pipeline_executor": self._executor}

    def _executor(self, state):
        """A pipeline plan's schedule runner: its ``trace``, ``executed`` order, ``span``
        and transfer ``stats`` of the last step."""
        if self._runner is None:
            raise AttributeError("pipeline_executor: this plan has no pipeline")
        return self._runner.executor
