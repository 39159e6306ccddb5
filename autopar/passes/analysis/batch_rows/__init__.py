"""Where the rows of a batch meet: the analysis that decides whether splitting the batch is exact.

Data parallelism, ZeRO, pipeline microbatches, gradient accumulation, D&SP's branches on
other rows and the 3D grid's row splits over ``z`` all give each rank (or each pass) a
part of the batch. That is exact only when every row's result depends on that row
alone, apart from the reductions autopar already makes the whole batch's: the loss's
reduction over the batch (averaged or summed over the parts), batch norm's statistics
(synchronised over the data ranks) and the routers' load-balancing statistics.

:func:`find_batch_couplings_pass` carries the batch through the graph: the inputs whose
first dimension is the batch (those the runtime splits, :func:`autopar.engine.executable.local_batch`)
hold the rows in dimension 0, and every op moves, keeps or consumes those dimensions by
its own rule (a view regroups them, a matmul contracts or keeps them, a reduction over
them consumes them). A node where rows meet is a :class:`Coupling`:

==================  ======================================================  ==================
kind                what meets                                              exact remedy
==================  ======================================================  ==================
``pairwise``        a product of two batch operands, one row per row of     ``gather``
                    each (``q @ d.T``: a contrastive or retrieval score)
``batch_mean``      a mean over the batch that is not the loss's            ``all_reduce``
                    (``h - h.mean(0)``)
``batch_sum``       a sum over the batch that is not the loss's             ``all_reduce``
``masked_mean``     the loss as a ratio of two sums over the batch          ``all_reduce``
                    (``(per_token * mask).sum() / mask.sum()``)
``reduce``          another reduction over the batch (``var``, ``max``,     none
                    a norm over rows)
``scan``            an op along the batch (softmax, cumsum, sort, top-k)    none
``index``           an index, slice or split across the batch (``x[0]``,    none
                    ``x[perm]``, ``chunk`` along it)
``concat``          batch tensors concatenated along the batch              none
``outer``           batch operands broadcast against each other             none
                    (``a[:, None] - b[None, :]``)
``positional``      a tensor of row positions (``arange(batch)``) used as   none
                    a number against the rows
``contract``        a product that sums over the batch (``x.T @ y``)        none
``attention``       attention whose sequence is the batch                   none
``unknown``         an op with no rule that does not keep the batch         none
                    dimension where it was
==================  ======================================================  ==================

The exact remedies (:mod:`autopar.strategies.data.batch_couplings`, ``sync_batch_couplings``):
``gather`` all-gathers both operands over the data ranks (gradient: reduce-scatter of
the sum), so each rank computes its rows of the product against every row of the batch
and its columns against every row (``q_r @ D.T`` and ``d_r @ Q.T``, as open_clip's
``gather_with_grad`` and SigLIP do), and a target made of row positions
(``arange(batch)``) is offset by the rank's first row; ``all_reduce`` makes a batch
statistic the mean over the data ranks of each rank's (forward and backward, equal
shares; for a masked mean both the numerator and the denominator, whose ratio is then
the whole batch's). Those remedies
need the parts of the batch to be on different ranks at once: a split into microbatches
(a pipeline, gradient accumulation) or D&SP's branches cannot use them, and neither can
a coupling without a remedy; the planner then does not weigh those splits and refuses
them when forced, naming the node (:func:`split_conflict`).

Ops with no rule are assumed to keep rows apart when their output keeps the batch
dimensions where their input had them (a warning names them); otherwise they are a
coupling of kind ``unknown``. The result is ``gm.meta[BATCH_COUPLINGS]``, a list of
:class:`Coupling` in graph order, and ``gm.meta[LOSS_TERMS]``: the reductions over the
batch the loss is a linear combination of, each a ``"mean"`` or a ``"sum"`` (the data pass
weighs a sum's share by the number of parts when the loss also holds a mean, so that
averaging the parts' losses gives the single device's); the graph is unchanged.

The package: :mod:`.rows` (what the walk carries, :class:`Rows`, and what it finds,
:class:`Coupling`), :mod:`.op_tables` (the ops by kind, both spellings), :mod:`.sources`
(walks back to where a value comes from), the walk itself (:mod:`.state`, the per-op
rules of :mod:`.view_rules` and :mod:`.compute_rules`, joined in :mod:`.walk`), what
the reductions over the batch are (:mod:`.loss_terms`), the pairwise scores' readers
(:mod:`.pairwise`), the pass (:mod:`.find`) and what the planner asks (:mod:`.conflicts`).
"""
from autopar.passes.analysis.batch_rows.conflicts import describe_all, remedy_text, split_conflict
from autopar.passes.analysis.batch_rows.find import batch_size, find_batch_couplings_pass
from autopar.passes.analysis.batch_rows.rows import Coupling, Rows, couplings
from autopar.passes.analysis.batch_rows.sources import bare_positions

__all__ = ["Coupling", "Rows", "bare_positions", "batch_size", "couplings", "describe_all", "find_batch_couplings_pass",
           "remedy_text", "split_conflict"]
