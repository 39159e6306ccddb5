"""Published large-model training runs (configuration + measured throughput) for checking the cost model.

Every row was read from the source named in its "source"/"quote" fields when this file was written (2026); nothing is from memory. BF16 (or fp16 mixed precision on A100) rows only -- no FP8 rows.
Figures that are derived rather than printed are marked as derived/assumed in the row's "notes".
See benchmarks/published_runs_sources.md for full citations, URLs/commits and each source's FLOP convention.

Sources (rows):
  1. Narayanan et al., SC'21 "Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM",
     Table 1 (10) and Table 2 (12) -- the paper's text (Narayanan et al., SC'21).
  2. NVIDIA/Megatron-LM README.md + images/model_table.png, Megatron-Core r0.8.0 weak scaling on H100 (9).
  3. Llama Team, AI @ Meta, "The Llama 3 Herd of Models", arXiv:2407.21783, Table 4 (3).
  4. pytorch/torchtitan benchmarks/llama3_h100_202412_torchtitan.md (4),
     benchmarks/asyncTP_llama3_h100_2025-06_torchtitan.md (4), docs/performance.md history (7).
  5. mosaicml/llm-foundry scripts/train/benchmarking/README.md, MPT on H100/A100 (25).
  6. NVIDIA-NeMo/Megatron-Bridge docs/performance-summary-archive.md, GPT-OSS 120B BF16 on H100/B200 (3).
  7. bigscience-workshop/bigscience train/tr11-176B-ml (BLOOM-176B) (1).
  8. Zhang et al. 2022, "OPT: Open Pre-trained Transformer Language Models", arXiv:2205.01068 (1).
  9. Singh et al., "A 4D Hybrid Algorithm to Scale Parallel Training to Thousands of GPUs" (AxoNN), Table III --
     the paper's text (Singh et al., AxoNN) (10).

Field conventions:
  - "published" holds only numbers printed by the source. "mfu" is the source's own utilization figure under
    its own FLOP count (Megatron PTD-P, BLOOM and AxoNN count the recompute forward pass, i.e. hardware-FLOPs
    style; Megatron-Core r0.8, MPT, torchtitan count 3 passes); read each row's notes before comparing.
  - mesh: tp, pp, dp, cp, ep, vp; None = not published. dp derived as gpus/(tp*pp*cp) where the source gives no
    DP column. vp = 1 when there is no interleaving, None when interleaving is used/possible but V is unknown.
  - fsdp: None | "zero1" | "zero2" | "zero3" | "fsdp" (Megatron distributed optimizer / BLOOM BF16_Optimizer =
    "zero1"; PyTorch FSDP FULL_SHARD / FSDP2 = "fsdp"; SHARD_GRAD_OP = "zero2").
  - schedule None = no pipeline (pp == 1) unless a row's notes say otherwise.
"""
from typing import Any

ROWS: list[dict[str, Any]] = [{'id': 'megatron-ptdp-t1-1p7b-a100',
  'source': 'Narayanan et al. 2021, Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM '
            "(SC'21), Table 1",
  'source_kind': 'paper',
  'quote': '1.7\t24\t2304\t24\t1\t1\t32\t512\t137\t44%\t4.4',
  'model': {'family': 'gpt',
            'layers': 24,
            'hidden': 2304,
            'heads': 24,
            'kv_heads': None,
            'ffn': 9216,
            'vocab': 51200,
            'seq': 2048,
            'params_b': 1.7,
            'hf_config': 'GPT2Config',
            'tied_embeddings': True},
  'hardware': 'a100-80gb',
  'gpus': 32,
  'mesh': {'tp': 1, 'pp': 1, 'dp': 32, 'cp': 1, 'ep': 1, 'vp': 1},
  'fsdp': None,
  'sequence_parallel': False,
  'schedule': None,
  'micro_batch': None,
  'global_batch': 512,
  'recompute': 'full',
  'precision': 'fp16',
  'torch_compile': False,
  'published': {'tflops_per_gpu': 137.0, 'tokens_per_s_per_gpu': None, 'mfu': 0.44, 'step_s': None},
  'notes': 'Selene, DGX A100 80GB, 8x200Gbps HDR IB per node. dp = gpus/(tp*pp) = 32 (derived; not a table column). '
           "Sec. 5.1: 'we use the interleaved pipeline schedule with the scatter/gather optimization enabled' (applies "
           'to pp>1 rows); the number of model chunks per rank (vp) and the microbatch size are NOT given for Table 1 '
           'in the paper text (Sec. 5.3/5.4 microbenchmarks use microbatch 1, Fig. 16 finds 2 best for a 91B model) -> '
           "micro_batch=None; vp=None on pp>1 rows. Precision: 'run with mixed precision', 16-bit peak 312 TFLOP/s "
           '(fp16 vs bf16 not stated; fp16 recorded). Recompute: Eq. 3 assumes activation recomputation (full, '
           'per-layer). No distributed optimizer / sequence parallelism (predates both). Aggregate 4.4 PFLOP/s. '
           "TFLOP/s convention: F = 96*B*s*l*h^2*(1 + s/(6h) + V/(16*l*h)) per iteration (Eq. 3, GEMMs only, 'assumes "
           'activation recomputation and takes into account the floating-point operations associated with the extra '
           "forward pass', i.e. 4 passes: hardware-FLOPs style, non-causal attention); 'throughput is measured for "
           "end-to-end training'; peak 312 TFLOP/s (A100, 16-bit). mfu field = the table's 'Percentage of theoretical "
           "peak FLOP/s' under that (recompute-inclusive) count. V = 51,200 and s = 2048 for all models (Sec. 5.1); "
           'ffn = 4h (standard GPT; Eq. 2 P = 12lh^2(1 + 13/(12h) + (V+s)/(12lh)) counts the V*h embedding once, so '
           'word embeddings are tied, and the s*h term is a learned position embedding).'},
 {'id': 'megatron-ptdp-t1-3p6b-a100',
  'source': 'Narayanan et al. 2021, Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM '
            "(SC'21), Table 1",
  'source_kind': 'paper',
  'quote': '3.6\t32\t3072\t30\t2\t1\t64\t512\t138\t44%\t8.8',
  'model': {'family': 'gpt',
            'layers': 30,
            'hidden': 3072,
            'heads': 32,
            'kv_heads': None,
            'ffn': 12288,
            'vocab': 51200,
            'seq': 2048,
            'params_b': 3.6,
            'hf_config': 'GPT2Config',
            'tied_embeddings': True},
  'hardware': 'a100-80gb',
  'gpus': 64,
  'mesh': {'tp': 2, 'pp': 1, 'dp': 32, 'cp': 1, 'ep': 1, 'vp': 1},
  'fsdp': None,
  'sequence_parallel': False,
  'schedule': None,
  'micro_batch': None,
  'global_batch': 512,
  'recompute': 'full',
  'precision': 'fp16',
  'torch_compile': False,
  'published': {'tflops_per_gpu': 138.0, 'tokens_per_s_per_gpu': None, 'mfu': 0.44, 'step_s': None},
  'notes': 'Selene, DGX A100 80GB, 8x200Gbps HDR IB per node. dp = gpus/(tp*pp) = 32 (derived; not a table column). '
           "Sec. 5.1: 'we use the interleaved pipeline schedule with the scatter/gather optimization enabled' (applies "
           'to pp>1 rows); the number of model chunks per rank (vp) and the microbatch size are NOT given for Table 1 '
           'in the paper text (Sec. 5.3/5.4 microbenchmarks use microbatch 1, Fig. 16 finds 2 best for a 91B model) -> '
           "micro_batch=None; vp=None on pp>1 rows. Precision: 'run with mixed precision', 16-bit peak 312 TFLOP/s "
           '(fp16 vs bf16 not stated; fp16 recorded). Recompute: Eq. 3 assumes activation recomputation (full, '
           'per-layer). No distributed optimizer / sequence parallelism (predates both). Aggregate 8.8 PFLOP/s. '
           "TFLOP/s convention: F = 96*B*s*l*h^2*(1 + s/(6h) + V/(16*l*h)) per iteration (Eq. 3, GEMMs only, 'assumes "
           'activation recomputation and takes into account the floating-point operations associated with the extra '
           "forward pass', i.e. 4 passes: hardware-FLOPs style, non-causal attention); 'throughput is measured for "
           "end-to-end training'; peak 312 TFLOP/s (A100, 16-bit). mfu field = the table's 'Percentage of theoretical "
           "peak FLOP/s' under that (recompute-inclusive) count. V = 51,200 and s = 2048 for all models (Sec. 5.1); "
           'ffn = 4h (standard GPT; Eq. 2 P = 12lh^2(1 + 13/(12h) + (V+s)/(12lh)) counts the V*h embedding once, so '
           'word embeddings are tied, and the s*h term is a learned position embedding).'},
 {'id': 'megatron-ptdp-t1-7p5b-a100',
  'source': 'Narayanan et al. 2021, Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM '
            "(SC'21), Table 1",
  'source_kind': 'paper',
  'quote': '7.5\t32\t4096\t36\t4\t1\t128\t512\t142\t46%\t18.2',
  'model': {'family': 'gpt',
            'layers': 36,
            'hidden': 4096,
            'heads': 32,
            'kv_heads': None,
            'ffn': 16384,
            'vocab': 51200,
            'seq': 2048,
            'params_b': 7.5,
            'hf_config': 'GPT2Config',
            'tied_embeddings': True},
  'hardware': 'a100-80gb',
  'gpus': 128,
  'mesh': {'tp': 4, 'pp': 1, 'dp': 32, 'cp': 1, 'ep': 1, 'vp': 1},
  'fsdp': None,
  'sequence_parallel': False,
  'schedule': None,
  'micro_batch': None,
  'global_batch': 512,
  'recompute': 'full',
  'precision': 'fp16',
  'torch_compile': False,
  'published': {'tflops_per_gpu': 142.0, 'tokens_per_s_per_gpu': None, 'mfu': 0.46, 'step_s': None},
  'notes': 'Selene, DGX A100 80GB, 8x200Gbps HDR IB per node. dp = gpus/(tp*pp) = 32 (derived; not a table column). '
           "Sec. 5.1: 'we use the interleaved pipeline schedule with the scatter/gather optimization enabled' (applies "
           'to pp>1 rows); the number of model chunks per rank (vp) and the microbatch size are NOT given for Table 1 '
           'in the paper text (Sec. 5.3/5.4 microbenchmarks use microbatch 1, Fig. 16 finds 2 best for a 91B model) -> '
           "micro_batch=None; vp=None on pp>1 rows. Precision: 'run with mixed precision', 16-bit peak 312 TFLOP/s "
           '(fp16 vs bf16 not stated; fp16 recorded). Recompute: Eq. 3 assumes activation recomputation (full, '
           'per-layer). No distributed optimizer / sequence parallelism (predates both). Aggregate 18.2 PFLOP/s. '
           "TFLOP/s convention: F = 96*B*s*l*h^2*(1 + s/(6h) + V/(16*l*h)) per iteration (Eq. 3, GEMMs only, 'assumes "
           'activation recomputation and takes into account the floating-point operations associated with the extra '
           "forward pass', i.e. 4 passes: hardware-FLOPs style, non-causal attention); 'throughput is measured for "
           "end-to-end training'; peak 312 TFLOP/s (A100, 16-bit). mfu field = the table's 'Percentage of theoretical "
           "peak FLOP/s' under that (recompute-inclusive) count. V = 51,200 and s = 2048 for all models (Sec. 5.1); "
           'ffn = 4h (standard GPT; Eq. 2 P = 12lh^2(1 + 13/(12h) + (V+s)/(12lh)) counts the V*h embedding once, so '
           'word embeddings are tied, and the s*h term is a learned position embedding).'},
 {'id': 'megatron-ptdp-t1-18p4b-a100',
  'source': 'Narayanan et al. 2021, Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM '
            "(SC'21), Table 1",
  'source_kind': 'paper',
  'quote': '18.4\t48\t6144\t40\t8\t1\t256\t1024\t135\t43%\t34.6',
  'model': {'family': 'gpt',
            'layers': 40,
            'hidden': 6144,
            'heads': 48,
            'kv_heads': None,
            'ffn': 24576,
            'vocab': 51200,
            'seq': 2048,
            'params_b': 18.4,
            'hf_config': 'GPT2Config',
            'tied_embeddings': True},
  'hardware': 'a100-80gb',
  'gpus': 256,
  'mesh': {'tp': 8, 'pp': 1, 'dp': 32, 'cp': 1, 'ep': 1, 'vp': 1},
  'fsdp': None,
  'sequence_parallel': False,
  'schedule': None,
  'micro_batch': None,
  'global_batch': 1024,
  'recompute': 'full',
  'precision': 'fp16',
  'torch_compile': False,
  'published': {'tflops_per_gpu': 135.0, 'tokens_per_s_per_gpu': None, 'mfu': 0.43, 'step_s': None},
  'notes': 'Selene, DGX A100 80GB, 8x200Gbps HDR IB per node. dp = gpus/(tp*pp) = 32 (derived; not a table column). '
           "Sec. 5.1: 'we use the interleaved pipeline schedule with the scatter/gather optimization enabled' (applies "
           'to pp>1 rows); the number of model chunks per rank (vp) and the microbatch size are NOT given for Table 1 '
           'in the paper text (Sec. 5.3/5.4 microbenchmarks use microbatch 1, Fig. 16 finds 2 best for a 91B model) -> '
           "micro_batch=None; vp=None on pp>1 rows. Precision: 'run with mixed precision', 16-bit peak 312 TFLOP/s "
           '(fp16 vs bf16 not stated; fp16 recorded). Recompute: Eq. 3 assumes activation recomputation (full, '
           'per-layer). No distributed optimizer / sequence parallelism (predates both). Aggregate 34.6 PFLOP/s. '
           "TFLOP/s convention: F = 96*B*s*l*h^2*(1 + s/(6h) + V/(16*l*h)) per iteration (Eq. 3, GEMMs only, 'assumes "
           'activation recomputation and takes into account the floating-point operations associated with the extra '
           "forward pass', i.e. 4 passes: hardware-FLOPs style, non-causal attention); 'throughput is measured for "
           "end-to-end training'; peak 312 TFLOP/s (A100, 16-bit). mfu field = the table's 'Percentage of theoretical "
           "peak FLOP/s' under that (recompute-inclusive) count. V = 51,200 and s = 2048 for all models (Sec. 5.1); "
           'ffn = 4h (standard GPT; Eq. 2 P = 12lh^2(1 + 13/(12h) + (V+s)/(12lh)) counts the V*h embedding once, so '
           'word embeddings are tied, and the s*h term is a learned position embedding).'},
 {'id': 'megatron-ptdp-t1-39p1b-a100',
  'source': 'Narayanan et al. 2021, Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM '
            "(SC'21), Table 1",
  'source_kind': 'paper',
  'quote': '39.1\t64\t8192\t48\t8\t2\t512\t1536\t138\t44%\t70.8',
  'model': {'family': 'gpt',
            'layers': 48,
            'hidden': 8192,
            'heads': 64,
            'kv_heads': None,
            'ffn': 32768,
            'vocab': 51200,
            'seq': 2048,
            'params_b': 39.1,
            'hf_config': 'GPT2Config',
            'tied_embeddings': True},
  'hardware': 'a100-80gb',
  'gpus': 512,
  'mesh': {'tp': 8, 'pp': 2, 'dp': 32, 'cp': 1, 'ep': 1, 'vp': None},
  'fsdp': None,
  'sequence_parallel': False,
  'schedule': 'interleaved',
  'micro_batch': None,
  'global_batch': 1536,
  'recompute': 'full',
  'precision': 'fp16',
  'torch_compile': False,
  'published': {'tflops_per_gpu': 138.0, 'tokens_per_s_per_gpu': None, 'mfu': 0.44, 'step_s': None},
  'notes': 'Selene, DGX A100 80GB, 8x200Gbps HDR IB per node. dp = gpus/(tp*pp) = 32 (derived; not a table column). '
           "Sec. 5.1: 'we use the interleaved pipeline schedule with the scatter/gather optimization enabled' (applies "
           'to pp>1 rows); the number of model chunks per rank (vp) and the microbatch size are NOT given for Table 1 '
           'in the paper text (Sec. 5.3/5.4 microbenchmarks use microbatch 1, Fig. 16 finds 2 best for a 91B model) -> '
           "micro_batch=None; vp=None on pp>1 rows. Precision: 'run with mixed precision', 16-bit peak 312 TFLOP/s "
           '(fp16 vs bf16 not stated; fp16 recorded). Recompute: Eq. 3 assumes activation recomputation (full, '
           'per-layer). No distributed optimizer / sequence parallelism (predates both). Aggregate 70.8 PFLOP/s. '
           "TFLOP/s convention: F = 96*B*s*l*h^2*(1 + s/(6h) + V/(16*l*h)) per iteration (Eq. 3, GEMMs only, 'assumes "
           'activation recomputation and takes into account the floating-point operations associated with the extra '
           "forward pass', i.e. 4 passes: hardware-FLOPs style, non-causal attention); 'throughput is measured for "
           "end-to-end training'; peak 312 TFLOP/s (A100, 16-bit). mfu field = the table's 'Percentage of theoretical "
           "peak FLOP/s' under that (recompute-inclusive) count. V = 51,200 and s = 2048 for all models (Sec. 5.1); "
           'ffn = 4h (standard GPT; Eq. 2 P = 12lh^2(1 + 13/(12h) + (V+s)/(12lh)) counts the V*h embedding once, so '
           'word embeddings are tied, and the s*h term is a learned position embedding).'},
 {'id': 'megatron-ptdp-t1-76p1b-a100',
  'source': 'Narayanan et al. 2021, Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM '
            "(SC'21), Table 1",
  'source_kind': 'paper',
  'quote': '76.1\t80\t10240\t60\t8\t4\t1024\t1792\t140\t45%\t143.8',
  'model': {'family': 'gpt',
            'layers': 60,
            'hidden': 10240,
            'heads': 80,
            'kv_heads': None,
            'ffn': 40960,
            'vocab': 51200,
            'seq': 2048,
            'params_b': 76.1,
            'hf_config': 'GPT2Config',
            'tied_embeddings': True},
  'hardware': 'a100-80gb',
  'gpus': 1024,
  'mesh': {'tp': 8, 'pp': 4, 'dp': 32, 'cp': 1, 'ep': 1, 'vp': None},
  'fsdp': None,
  'sequence_parallel': False,
  'schedule': 'interleaved',
  'micro_batch': None,
  'global_batch': 1792,
  'recompute': 'full',
  'precision': 'fp16',
  'torch_compile': False,
  'published': {'tflops_per_gpu': 140.0, 'tokens_per_s_per_gpu': None, 'mfu': 0.45, 'step_s': None},
  'notes': 'Selene, DGX A100 80GB, 8x200Gbps HDR IB per node. dp = gpus/(tp*pp) = 32 (derived; not a table column). '
           "Sec. 5.1: 'we use the interleaved pipeline schedule with the scatter/gather optimization enabled' (applies "
           'to pp>1 rows); the number of model chunks per rank (vp) and the microbatch size are NOT given for Table 1 '
           'in the paper text (Sec. 5.3/5.4 microbenchmarks use microbatch 1, Fig. 16 finds 2 best for a 91B model) -> '
           "micro_batch=None; vp=None on pp>1 rows. Precision: 'run with mixed precision', 16-bit peak 312 TFLOP/s "
           '(fp16 vs bf16 not stated; fp16 recorded). Recompute: Eq. 3 assumes activation recomputation (full, '
           'per-layer). No distributed optimizer / sequence parallelism (predates both). Aggregate 143.8 PFLOP/s. '
           "TFLOP/s convention: F = 96*B*s*l*h^2*(1 + s/(6h) + V/(16*l*h)) per iteration (Eq. 3, GEMMs only, 'assumes "
           'activation recomputation and takes into account the floating-point operations associated with the extra '
           "forward pass', i.e. 4 passes: hardware-FLOPs style, non-causal attention); 'throughput is measured for "
           "end-to-end training'; peak 312 TFLOP/s (A100, 16-bit). mfu field = the table's 'Percentage of theoretical "
           "peak FLOP/s' under that (recompute-inclusive) count. V = 51,200 and s = 2048 for all models (Sec. 5.1); "
           'ffn = 4h (standard GPT; Eq. 2 P = 12lh^2(1 + 13/(12h) + (V+s)/(12lh)) counts the V*h embedding once, so '
           'word embeddings are tied, and the s*h term is a learned position embedding).'},
 {'id': 'megatron-ptdp-t1-145p6b-a100',
  'source': 'Narayanan et al. 2021, Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM '
            "(SC'21), Table 1",
  'source_kind': 'paper',
  'quote': '145.6\t96\t12288\t80\t8\t8\t1536\t2304\t148\t47%\t227.1',
  'model': {'family': 'gpt',
            'layers': 80,
            'hidden': 12288,
            'heads': 96,
            'kv_heads': None,
            'ffn': 49152,
            'vocab': 51200,
            'seq': 2048,
            'params_b': 145.6,
            'hf_config': 'GPT2Config',
            'tied_embeddings': True},
  'hardware': 'a100-80gb',
  'gpus': 1536,
  'mesh': {'tp': 8, 'pp': 8, 'dp': 24, 'cp': 1, 'ep': 1, 'vp': None},
  'fsdp': None,
  'sequence_parallel': False,
  'schedule': 'interleaved',
  'micro_batch': None,
  'global_batch': 2304,
  'recompute': 'full',
  'precision': 'fp16',
  'torch_compile': False,
  'published': {'tflops_per_gpu': 148.0, 'tokens_per_s_per_gpu': None, 'mfu': 0.47, 'step_s': None},
  'notes': 'Selene, DGX A100 80GB, 8x200Gbps HDR IB per node. dp = gpus/(tp*pp) = 24 (derived; not a table column). '
           "Sec. 5.1: 'we use the interleaved pipeline schedule with the scatter/gather optimization enabled' (applies "
           'to pp>1 rows); the number of model chunks per rank (vp) and the microbatch size are NOT given for Table 1 '
           'in the paper text (Sec. 5.3/5.4 microbenchmarks use microbatch 1, Fig. 16 finds 2 best for a 91B model) -> '
           "micro_batch=None; vp=None on pp>1 rows. Precision: 'run with mixed precision', 16-bit peak 312 TFLOP/s "
           '(fp16 vs bf16 not stated; fp16 recorded). Recompute: Eq. 3 assumes activation recomputation (full, '
           'per-layer). No distributed optimizer / sequence parallelism (predates both). Aggregate 227.1 PFLOP/s. '
           "TFLOP/s convention: F = 96*B*s*l*h^2*(1 + s/(6h) + V/(16*l*h)) per iteration (Eq. 3, GEMMs only, 'assumes "
           'activation recomputation and takes into account the floating-point operations associated with the extra '
           "forward pass', i.e. 4 passes: hardware-FLOPs style, non-causal attention); 'throughput is measured for "
           "end-to-end training'; peak 312 TFLOP/s (A100, 16-bit). mfu field = the table's 'Percentage of theoretical "
           "peak FLOP/s' under that (recompute-inclusive) count. V = 51,200 and s = 2048 for all models (Sec. 5.1); "
           'ffn = 4h (standard GPT; Eq. 2 P = 12lh^2(1 + 13/(12h) + (V+s)/(12lh)) counts the V*h embedding once, so '
           'word embeddings are tied, and the s*h term is a learned position embedding).'},
 {'id': 'megatron-ptdp-t1-310p1b-a100',
  'source': 'Narayanan et al. 2021, Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM '
            "(SC'21), Table 1",
  'source_kind': 'paper',
  'quote': '310.1\t128\t16384\t96\t8\t16\t1920\t2160\t155\t50%\t297.4',
  'model': {'family': 'gpt',
            'layers': 96,
            'hidden': 16384,
            'heads': 128,
            'kv_heads': None,
            'ffn': 65536,
            'vocab': 51200,
            'seq': 2048,
            'params_b': 310.1,
            'hf_config': 'GPT2Config',
            'tied_embeddings': True},
  'hardware': 'a100-80gb',
  'gpus': 1920,
  'mesh': {'tp': 8, 'pp': 16, 'dp': 15, 'cp': 1, 'ep': 1, 'vp': None},
  'fsdp': None,
  'sequence_parallel': False,
  'schedule': 'interleaved',
  'micro_batch': None,
  'global_batch': 2160,
  'recompute': 'full',
  'precision': 'fp16',
  'torch_compile': False,
  'published': {'tflops_per_gpu': 155.0, 'tokens_per_s_per_gpu': None, 'mfu': 0.5, 'step_s': None},
  'notes': 'Selene, DGX A100 80GB, 8x200Gbps HDR IB per node. dp = gpus/(tp*pp) = 15 (derived; not a table column). '
           "Sec. 5.1: 'we use the interleaved pipeline schedule with the scatter/gather optimization enabled' (applies "
           'to pp>1 rows); the number of model chunks per rank (vp) and the microbatch size are NOT given for Table 1 '
           'in the paper text (Sec. 5.3/5.4 microbenchmarks use microbatch 1, Fig. 16 finds 2 best for a 91B model) -> '
           "micro_batch=None; vp=None on pp>1 rows. Precision: 'run with mixed precision', 16-bit peak 312 TFLOP/s "
           '(fp16 vs bf16 not stated; fp16 recorded). Recompute: Eq. 3 assumes activation recomputation (full, '
           'per-layer). No distributed optimizer / sequence parallelism (predates both). Aggregate 297.4 PFLOP/s. '
           "TFLOP/s convention: F = 96*B*s*l*h^2*(1 + s/(6h) + V/(16*l*h)) per iteration (Eq. 3, GEMMs only, 'assumes "
           'activation recomputation and takes into account the floating-point operations associated with the extra '
           "forward pass', i.e. 4 passes: hardware-FLOPs style, non-causal attention); 'throughput is measured for "
           "end-to-end training'; peak 312 TFLOP/s (A100, 16-bit). mfu field = the table's 'Percentage of theoretical "
           "peak FLOP/s' under that (recompute-inclusive) count. V = 51,200 and s = 2048 for all models (Sec. 5.1); "
           'ffn = 4h (standard GPT; Eq. 2 P = 12lh^2(1 + 13/(12h) + (V+s)/(12lh)) counts the V*h embedding once, so '
           'word embeddings are tied, and the s*h term is a learned position embedding).'},
 {'id': 'megatron-ptdp-t1-529p6b-a100',
  'source': 'Narayanan et al. 2021, Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM '
            "(SC'21), Table 1",
  'source_kind': 'paper',
  'quote': '529.6\t128\t20480\t105\t8\t35\t2520\t2520\t163\t52%\t410.2',
  'model': {'family': 'gpt',
            'layers': 105,
            'hidden': 20480,
            'heads': 128,
            'kv_heads': None,
            'ffn': 81920,
            'vocab': 51200,
            'seq': 2048,
            'params_b': 529.6,
            'hf_config': 'GPT2Config',
            'tied_embeddings': True},
  'hardware': 'a100-80gb',
  'gpus': 2520,
  'mesh': {'tp': 8, 'pp': 35, 'dp': 9, 'cp': 1, 'ep': 1, 'vp': None},
  'fsdp': None,
  'sequence_parallel': False,
  'schedule': 'interleaved',
  'micro_batch': None,
  'global_batch': 2520,
  'recompute': 'full',
  'precision': 'fp16',
  'torch_compile': False,
  'published': {'tflops_per_gpu': 163.0, 'tokens_per_s_per_gpu': None, 'mfu': 0.52, 'step_s': None},
  'notes': 'Selene, DGX A100 80GB, 8x200Gbps HDR IB per node. dp = gpus/(tp*pp) = 9 (derived; not a table column). '
           "Sec. 5.1: 'we use the interleaved pipeline schedule with the scatter/gather optimization enabled' (applies "
           'to pp>1 rows); the number of model chunks per rank (vp) and the microbatch size are NOT given for Table 1 '
           'in the paper text (Sec. 5.3/5.4 microbenchmarks use microbatch 1, Fig. 16 finds 2 best for a 91B model) -> '
           "micro_batch=None; vp=None on pp>1 rows. Precision: 'run with mixed precision', 16-bit peak 312 TFLOP/s "
           '(fp16 vs bf16 not stated; fp16 recorded). Recompute: Eq. 3 assumes activation recomputation (full, '
           'per-layer). No distributed optimizer / sequence parallelism (predates both). Aggregate 410.2 PFLOP/s. '
           "TFLOP/s convention: F = 96*B*s*l*h^2*(1 + s/(6h) + V/(16*l*h)) per iteration (Eq. 3, GEMMs only, 'assumes "
           'activation recomputation and takes into account the floating-point operations associated with the extra '
           "forward pass', i.e. 4 passes: hardware-FLOPs style, non-causal attention); 'throughput is measured for "
           "end-to-end training'; peak 312 TFLOP/s (A100, 16-bit). mfu field = the table's 'Percentage of theoretical "
           "peak FLOP/s' under that (recompute-inclusive) count. V = 51,200 and s = 2048 for all models (Sec. 5.1); "
           'ffn = 4h (standard GPT; Eq. 2 P = 12lh^2(1 + 13/(12h) + (V+s)/(12lh)) counts the V*h embedding once, so '
           'word embeddings are tied, and the s*h term is a learned position embedding).'},
 {'id': 'megatron-ptdp-t1-1008p0b-a100',
  'source': 'Narayanan et al. 2021, Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM '
            "(SC'21), Table 1",
  'source_kind': 'paper',
  'quote': '1008.0\t160\t25600\t128\t8\t64\t3072\t3072\t163\t52%\t502.0',
  'model': {'family': 'gpt',
            'layers': 128,
            'hidden': 25600,
            'heads': 160,
            'kv_heads': None,
            'ffn': 102400,
            'vocab': 51200,
            'seq': 2048,
            'params_b': 1008.0,
            'hf_config': 'GPT2Config',
            'tied_embeddings': True},
  'hardware': 'a100-80gb',
  'gpus': 3072,
  'mesh': {'tp': 8, 'pp': 64, 'dp': 6, 'cp': 1, 'ep': 1, 'vp': None},
  'fsdp': None,
  'sequence_parallel': False,
  'schedule': 'interleaved',
  'micro_batch': None,
  'global_batch': 3072,
  'recompute': 'full',
  'precision': 'fp16',
  'torch_compile': False,
  'published': {'tflops_per_gpu': 163.0, 'tokens_per_s_per_gpu': None, 'mfu': 0.52, 'step_s': None},
  'notes': 'Selene, DGX A100 80GB, 8x200Gbps HDR IB per node. dp = gpus/(tp*pp) = 6 (derived; not a table column). '
           "Sec. 5.1: 'we use the interleaved pipeline schedule with the scatter/gather optimization enabled' (applies "
           'to pp>1 rows); the number of model chunks per rank (vp) and the microbatch size are NOT given for Table 1 '
           'in the paper text (Sec. 5.3/5.4 microbenchmarks use microbatch 1, Fig. 16 finds 2 best for a 91B model) -> '
           "micro_batch=None; vp=None on pp>1 rows. Precision: 'run with mixed precision', 16-bit peak 312 TFLOP/s "
           '(fp16 vs bf16 not stated; fp16 recorded). Recompute: Eq. 3 assumes activation recomputation (full, '
           'per-layer). No distributed optimizer / sequence parallelism (predates both). Aggregate 502.0 PFLOP/s. '
           "TFLOP/s convention: F = 96*B*s*l*h^2*(1 + s/(6h) + V/(16*l*h)) per iteration (Eq. 3, GEMMs only, 'assumes "
           'activation recomputation and takes into account the floating-point operations associated with the extra '
           "forward pass', i.e. 4 passes: hardware-FLOPs style, non-causal attention); 'throughput is measured for "
           "end-to-end training'; peak 312 TFLOP/s (A100, 16-bit). mfu field = the table's 'Percentage of theoretical "
           "peak FLOP/s' under that (recompute-inclusive) count. V = 51,200 and s = 2048 for all models (Sec. 5.1); "
           'ffn = 4h (standard GPT; Eq. 2 P = 12lh^2(1 + 13/(12h) + (V+s)/(12lh)) counts the V*h embedding once, so '
           'word embeddings are tied, and the s*h term is a learned position embedding).'},
 {'id': 'megatron-ptdp-t2-zero3-174p6b-384gpu-a100',
  'source': 'Narayanan et al. 2021, Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM '
            "(SC'21), Table 2",
  'source_kind': 'paper',
  'quote': 'ZeRO-3 without Model Parallelism\t174.6\t1\t1536\t384\t4\t144\t90',
  'model': {'family': 'gpt',
            'layers': 96,
            'hidden': 12288,
            'heads': 96,
            'kv_heads': None,
            'ffn': 49152,
            'vocab': 51200,
            'seq': 2048,
            'params_b': 174.6,
            'hf_config': 'GPT2Config',
            'tied_embeddings': True},
  'hardware': 'a100-80gb',
  'gpus': 384,
  'mesh': {'tp': 1, 'pp': 1, 'dp': 384, 'cp': 1, 'ep': 1, 'vp': 1},
  'fsdp': 'zero3',
  'sequence_parallel': False,
  'schedule': None,
  'micro_batch': 4,
  'global_batch': 1536,
  'recompute': 'full',
  'precision': 'fp16',
  'torch_compile': False,
  'published': {'tflops_per_gpu': 144.0, 'tokens_per_s_per_gpu': None, 'mfu': None, 'step_s': None},
  'notes': 'ZeRO-3 (DeepSpeed) without model parallelism: dp = gpus = 384; global batch 1536 / dp 384 = 4 = the '
           "table's microbatch size, i.e. one microbatch per step (derived). 174.6B = 'standard GPT-3 model "
           "architecture' (96 layers, 96 heads, h=12288, Sec. 5.3.2); 529.6B = Table 1's 530B model (105 layers, 128 "
           'heads, h=20480). Recompute assumed full as for Table 1 (Eq. 3 count). Only TFLOP/s per GPU (and days for '
           '300B tokens) are published; % of peak not given for Table 2. TFLOP/s convention: F = 96*B*s*l*h^2*(1 + '
           "s/(6h) + V/(16*l*h)) per iteration (Eq. 3, GEMMs only, 'assumes activation recomputation and takes into "
           "account the floating-point operations associated with the extra forward pass', i.e. 4 passes: "
           "hardware-FLOPs style, non-causal attention); 'throughput is measured for end-to-end training'; peak 312 "
           "TFLOP/s (A100, 16-bit). mfu field = the table's 'Percentage of theoretical peak FLOP/s' under that "
           '(recompute-inclusive) count.'},
 {'id': 'megatron-ptdp-t2-zero3-174p6b-768gpu-a100',
  'source': 'Narayanan et al. 2021, Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM '
            "(SC'21), Table 2",
  'source_kind': 'paper',
  'quote': '768\t2\t88\t74',
  'model': {'family': 'gpt',
            'layers': 96,
            'hidden': 12288,
            'heads': 96,
            'kv_heads': None,
            'ffn': 49152,
            'vocab': 51200,
            'seq': 2048,
            'params_b': 174.6,
            'hf_config': 'GPT2Config',
            'tied_embeddings': True},
  'hardware': 'a100-80gb',
  'gpus': 768,
  'mesh': {'tp': 1, 'pp': 1, 'dp': 768, 'cp': 1, 'ep': 1, 'vp': 1},
  'fsdp': 'zero3',
  'sequence_parallel': False,
  'schedule': None,
  'micro_batch': 2,
  'global_batch': 1536,
  'recompute': 'full',
  'precision': 'fp16',
  'torch_compile': False,
  'published': {'tflops_per_gpu': 88.0, 'tokens_per_s_per_gpu': None, 'mfu': None, 'step_s': None},
  'notes': 'ZeRO-3 (DeepSpeed) without model parallelism: dp = gpus = 768; global batch 1536 / dp 768 = 2 = the '
           "table's microbatch size, i.e. one microbatch per step (derived). 174.6B = 'standard GPT-3 model "
           "architecture' (96 layers, 96 heads, h=12288, Sec. 5.3.2); 529.6B = Table 1's 530B model (105 layers, 128 "
           'heads, h=20480). Recompute assumed full as for Table 1 (Eq. 3 count). Only TFLOP/s per GPU (and days for '
           '300B tokens) are published; % of peak not given for Table 2. TFLOP/s convention: F = 96*B*s*l*h^2*(1 + '
           "s/(6h) + V/(16*l*h)) per iteration (Eq. 3, GEMMs only, 'assumes activation recomputation and takes into "
           "account the floating-point operations associated with the extra forward pass', i.e. 4 passes: "
           "hardware-FLOPs style, non-causal attention); 'throughput is measured for end-to-end training'; peak 312 "
           "TFLOP/s (A100, 16-bit). mfu field = the table's 'Percentage of theoretical peak FLOP/s' under that "
           '(recompute-inclusive) count.'},
 {'id': 'megatron-ptdp-t2-zero3-174p6b-1536gpu-a100',
  'source': 'Narayanan et al. 2021, Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM '
            "(SC'21), Table 2",
  'source_kind': 'paper',
  'quote': '1536\t1\t44\t74',
  'model': {'family': 'gpt',
            'layers': 96,
            'hidden': 12288,
            'heads': 96,
            'kv_heads': None,
            'ffn': 49152,
            'vocab': 51200,
            'seq': 2048,
            'params_b': 174.6,
            'hf_config': 'GPT2Config',
            'tied_embeddings': True},
  'hardware': 'a100-80gb',
  'gpus': 1536,
  'mesh': {'tp': 1, 'pp': 1, 'dp': 1536, 'cp': 1, 'ep': 1, 'vp': 1},
  'fsdp': 'zero3',
  'sequence_parallel': False,
  'schedule': None,
  'micro_batch': 1,
  'global_batch': 1536,
  'recompute': 'full',
  'precision': 'fp16',
  'torch_compile': False,
  'published': {'tflops_per_gpu': 44.0, 'tokens_per_s_per_gpu': None, 'mfu': None, 'step_s': None},
  'notes': 'ZeRO-3 (DeepSpeed) without model parallelism: dp = gpus = 1536; global batch 1536 / dp 1536 = 1 = the '
           "table's microbatch size, i.e. one microbatch per step (derived). 174.6B = 'standard GPT-3 model "
           "architecture' (96 layers, 96 heads, h=12288, Sec. 5.3.2); 529.6B = Table 1's 530B model (105 layers, 128 "
           'heads, h=20480). Recompute assumed full as for Table 1 (Eq. 3 count). Only TFLOP/s per GPU (and days for '
           '300B tokens) are published; % of peak not given for Table 2. TFLOP/s convention: F = 96*B*s*l*h^2*(1 + '
           "s/(6h) + V/(16*l*h)) per iteration (Eq. 3, GEMMs only, 'assumes activation recomputation and takes into "
           "account the floating-point operations associated with the extra forward pass', i.e. 4 passes: "
           "hardware-FLOPs style, non-causal attention); 'throughput is measured for end-to-end training'; peak 312 "
           "TFLOP/s (A100, 16-bit). mfu field = the table's 'Percentage of theoretical peak FLOP/s' under that "
           '(recompute-inclusive) count.'},
 {'id': 'megatron-ptdp-t2-zero3-529p6b-640gpu-a100',
  'source': 'Narayanan et al. 2021, Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM '
            "(SC'21), Table 2",
  'source_kind': 'paper',
  'quote': '529.6\t1\t2560*\t640\t4\t138\t169',
  'model': {'family': 'gpt',
            'layers': 105,
            'hidden': 20480,
            'heads': 128,
            'kv_heads': None,
            'ffn': 81920,
            'vocab': 51200,
            'seq': 2048,
            'params_b': 529.6,
            'hf_config': 'GPT2Config',
            'tied_embeddings': True},
  'hardware': 'a100-80gb',
  'gpus': 640,
  'mesh': {'tp': 1, 'pp': 1, 'dp': 640, 'cp': 1, 'ep': 1, 'vp': 1},
  'fsdp': 'zero3',
  'sequence_parallel': False,
  'schedule': None,
  'micro_batch': 4,
  'global_batch': 2560,
  'recompute': 'full',
  'precision': 'fp16',
  'torch_compile': False,
  'published': {'tflops_per_gpu': 138.0, 'tokens_per_s_per_gpu': None, 'mfu': None, 'step_s': None},
  'notes': 'ZeRO-3 (DeepSpeed) without model parallelism: dp = gpus = 640; global batch 2560 / dp 640 = 4 = the '
           "table's microbatch size, i.e. one microbatch per step (derived). The '*' row: 530B 'did not fit on 560 "
           'GPUs when using a microbatch size of 4 with ZeRO-3, so we increased the number of GPUs used to 640 and '
           "global batch size to 2560'. 174.6B = 'standard GPT-3 model architecture' (96 layers, 96 heads, h=12288, "
           "Sec. 5.3.2); 529.6B = Table 1's 530B model (105 layers, 128 heads, h=20480). Recompute assumed full as for "
           'Table 1 (Eq. 3 count). Only TFLOP/s per GPU (and days for 300B tokens) are published; % of peak not given '
           'for Table 2. TFLOP/s convention: F = 96*B*s*l*h^2*(1 + s/(6h) + V/(16*l*h)) per iteration (Eq. 3, GEMMs '
           "only, 'assumes activation recomputation and takes into account the floating-point operations associated "
           "with the extra forward pass', i.e. 4 passes: hardware-FLOPs style, non-causal attention); 'throughput is "
           "measured for end-to-end training'; peak 312 TFLOP/s (A100, 16-bit). mfu field = the table's 'Percentage of "
           "theoretical peak FLOP/s' under that (recompute-inclusive) count."},
 {'id': 'megatron-ptdp-t2-zero3-529p6b-1120gpu-a100',
  'source': 'Narayanan et al. 2021, Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM '
            "(SC'21), Table 2",
  'source_kind': 'paper',
  'quote': '1120\t2\t98\t137',
  'model': {'family': 'gpt',
            'layers': 105,
            'hidden': 20480,
            'heads': 128,
            'kv_heads': None,
            'ffn': 81920,
            'vocab': 51200,
            'seq': 2048,
            'params_b': 529.6,
            'hf_config': 'GPT2Config',
            'tied_embeddings': True},
  'hardware': 'a100-80gb',
  'gpus': 1120,
  'mesh': {'tp': 1, 'pp': 1, 'dp': 1120, 'cp': 1, 'ep': 1, 'vp': 1},
  'fsdp': 'zero3',
  'sequence_parallel': False,
  'schedule': None,
  'micro_batch': 2,
  'global_batch': 2240,
  'recompute': 'full',
  'precision': 'fp16',
  'torch_compile': False,
  'published': {'tflops_per_gpu': 98.0, 'tokens_per_s_per_gpu': None, 'mfu': None, 'step_s': None},
  'notes': 'ZeRO-3 (DeepSpeed) without model parallelism: dp = gpus = 1120; global batch 2240 / dp 1120 = 2 = the '
           "table's microbatch size, i.e. one microbatch per step (derived). Global batch 2240 assumed for the "
           "1120/2240-GPU ZeRO-3 rows: the caption marks only the 640-GPU row as using 2560 and the text says 'We keep "
           "the global batch size the same as we increase the number of GPUs' (2240/1120 = 2 and 2240/2240 = 1 match "
           "the microbatch column). 174.6B = 'standard GPT-3 model architecture' (96 layers, 96 heads, h=12288, Sec. "
           "5.3.2); 529.6B = Table 1's 530B model (105 layers, 128 heads, h=20480). Recompute assumed full as for "
           'Table 1 (Eq. 3 count). Only TFLOP/s per GPU (and days for 300B tokens) are published; % of peak not given '
           'for Table 2. TFLOP/s convention: F = 96*B*s*l*h^2*(1 + s/(6h) + V/(16*l*h)) per iteration (Eq. 3, GEMMs '
           "only, 'assumes activation recomputation and takes into account the floating-point operations associated "
           "with the extra forward pass', i.e. 4 passes: hardware-FLOPs style, non-causal attention); 'throughput is "
           "measured for end-to-end training'; peak 312 TFLOP/s (A100, 16-bit). mfu field = the table's 'Percentage of "
           "theoretical peak FLOP/s' under that (recompute-inclusive) count."},
 {'id': 'megatron-ptdp-t2-zero3-529p6b-2240gpu-a100',
  'source': 'Narayanan et al. 2021, Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM '
            "(SC'21), Table 2",
  'source_kind': 'paper',
  'quote': '2240\t1\t48\t140',
  'model': {'family': 'gpt',
            'layers': 105,
            'hidden': 20480,
            'heads': 128,
            'kv_heads': None,
            'ffn': 81920,
            'vocab': 51200,
            'seq': 2048,
            'params_b': 529.6,
            'hf_config': 'GPT2Config',
            'tied_embeddings': True},
  'hardware': 'a100-80gb',
  'gpus': 2240,
  'mesh': {'tp': 1, 'pp': 1, 'dp': 2240, 'cp': 1, 'ep': 1, 'vp': 1},
  'fsdp': 'zero3',
  'sequence_parallel': False,
  'schedule': None,
  'micro_batch': 1,
  'global_batch': 2240,
  'recompute': 'full',
  'precision': 'fp16',
  'torch_compile': False,
  'published': {'tflops_per_gpu': 48.0, 'tokens_per_s_per_gpu': None, 'mfu': None, 'step_s': None},
  'notes': 'ZeRO-3 (DeepSpeed) without model parallelism: dp = gpus = 2240; global batch 2240 / dp 2240 = 1 = the '
           "table's microbatch size, i.e. one microbatch per step (derived). Global batch 2240 assumed for the "
           "1120/2240-GPU ZeRO-3 rows: the caption marks only the 640-GPU row as using 2560 and the text says 'We keep "
           "the global batch size the same as we increase the number of GPUs' (2240/1120 = 2 and 2240/2240 = 1 match "
           "the microbatch column). 174.6B = 'standard GPT-3 model architecture' (96 layers, 96 heads, h=12288, Sec. "
           "5.3.2); 529.6B = Table 1's 530B model (105 layers, 128 heads, h=20480). Recompute assumed full as for "
           'Table 1 (Eq. 3 count). Only TFLOP/s per GPU (and days for 300B tokens) are published; % of peak not given '
           'for Table 2. TFLOP/s convention: F = 96*B*s*l*h^2*(1 + s/(6h) + V/(16*l*h)) per iteration (Eq. 3, GEMMs '
           "only, 'assumes activation recomputation and takes into account the floating-point operations associated "
           "with the extra forward pass', i.e. 4 passes: hardware-FLOPs style, non-causal attention); 'throughput is "
           "measured for end-to-end training'; peak 312 TFLOP/s (A100, 16-bit). mfu field = the table's 'Percentage of "
           "theoretical peak FLOP/s' under that (recompute-inclusive) count."},
 {'id': 'megatron-ptdp-t2-ptdp-174p6b-384gpu-a100',
  'source': 'Narayanan et al. 2021, Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM '
            "(SC'21), Table 2",
  'source_kind': 'paper',
  'quote': 'PTD Parallelism\t174.6\t96\t1536\t384\t1\t153\t84',
  'model': {'family': 'gpt',
            'layers': 96,
            'hidden': 12288,
            'heads': 96,
            'kv_heads': None,
            'ffn': 49152,
            'vocab': 51200,
            'seq': 2048,
            'params_b': 174.6,
            'hf_config': 'GPT2Config',
            'tied_embeddings': True},
  'hardware': 'a100-80gb',
  'gpus': 384,
  'mesh': {'tp': 8, 'pp': 12, 'dp': 4, 'cp': 1, 'ep': 1, 'vp': None},
  'fsdp': None,
  'sequence_parallel': False,
  'schedule': 'interleaved',
  'micro_batch': 1,
  'global_batch': 1536,
  'recompute': 'full',
  'precision': 'fp16',
  'torch_compile': False,
  'published': {'tflops_per_gpu': 153.0, 'tokens_per_s_per_gpu': None, 'mfu': None, 'step_s': None},
  'notes': "Table 2 gives only 'Model-parallel size' 96; the tp=8 x pp=12 split is an ASSUMPTION (tp=8 within a DGX "
           'node as in every Table 1 multi-node row; 96 layers / 12 stages). dp = gpus/mp = 4 (derived). Schedule not '
           "restated for Table 2: Sec. 5.1 says the end-to-end runs use 'the interleaved pipeline schedule with the "
           "scatter/gather optimization' -> interleaved assumed, number of chunks not given (vp=None). TFLOP/s "
           "convention: F = 96*B*s*l*h^2*(1 + s/(6h) + V/(16*l*h)) per iteration (Eq. 3, GEMMs only, 'assumes "
           'activation recomputation and takes into account the floating-point operations associated with the extra '
           "forward pass', i.e. 4 passes: hardware-FLOPs style, non-causal attention); 'throughput is measured for "
           "end-to-end training'; peak 312 TFLOP/s (A100, 16-bit). mfu field = the table's 'Percentage of theoretical "
           "peak FLOP/s' under that (recompute-inclusive) count."},
 {'id': 'megatron-ptdp-t2-ptdp-174p6b-768gpu-a100',
  'source': 'Narayanan et al. 2021, Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM '
            "(SC'21), Table 2",
  'source_kind': 'paper',
  'quote': '768\t1\t149\t43',
  'model': {'family': 'gpt',
            'layers': 96,
            'hidden': 12288,
            'heads': 96,
            'kv_heads': None,
            'ffn': 49152,
            'vocab': 51200,
            'seq': 2048,
            'params_b': 174.6,
            'hf_config': 'GPT2Config',
            'tied_embeddings': True},
  'hardware': 'a100-80gb',
  'gpus': 768,
  'mesh': {'tp': 8, 'pp': 12, 'dp': 8, 'cp': 1, 'ep': 1, 'vp': None},
  'fsdp': None,
  'sequence_parallel': False,
  'schedule': 'interleaved',
  'micro_batch': 1,
  'global_batch': 1536,
  'recompute': 'full',
  'precision': 'fp16',
  'torch_compile': False,
  'published': {'tflops_per_gpu': 149.0, 'tokens_per_s_per_gpu': None, 'mfu': None, 'step_s': None},
  'notes': "Table 2 gives only 'Model-parallel size' 96; the tp=8 x pp=12 split is an ASSUMPTION (tp=8 within a DGX "
           'node as in every Table 1 multi-node row; 96 layers / 12 stages). dp = gpus/mp = 8 (derived). Schedule not '
           "restated for Table 2: Sec. 5.1 says the end-to-end runs use 'the interleaved pipeline schedule with the "
           "scatter/gather optimization' -> interleaved assumed, number of chunks not given (vp=None). TFLOP/s "
           "convention: F = 96*B*s*l*h^2*(1 + s/(6h) + V/(16*l*h)) per iteration (Eq. 3, GEMMs only, 'assumes "
           'activation recomputation and takes into account the floating-point operations associated with the extra '
           "forward pass', i.e. 4 passes: hardware-FLOPs style, non-causal attention); 'throughput is measured for "
           "end-to-end training'; peak 312 TFLOP/s (A100, 16-bit). mfu field = the table's 'Percentage of theoretical "
           "peak FLOP/s' under that (recompute-inclusive) count."},
 {'id': 'megatron-ptdp-t2-ptdp-174p6b-1536gpu-a100',
  'source': 'Narayanan et al. 2021, Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM '
            "(SC'21), Table 2",
  'source_kind': 'paper',
  'quote': '1536\t1\t141\t23',
  'model': {'family': 'gpt',
            'layers': 96,
            'hidden': 12288,
            'heads': 96,
            'kv_heads': None,
            'ffn': 49152,
            'vocab': 51200,
            'seq': 2048,
            'params_b': 174.6,
            'hf_config': 'GPT2Config',
            'tied_embeddings': True},
  'hardware': 'a100-80gb',
  'gpus': 1536,
  'mesh': {'tp': 8, 'pp': 12, 'dp': 16, 'cp': 1, 'ep': 1, 'vp': None},
  'fsdp': None,
  'sequence_parallel': False,
  'schedule': 'interleaved',
  'micro_batch': 1,
  'global_batch': 1536,
  'recompute': 'full',
  'precision': 'fp16',
  'torch_compile': False,
  'published': {'tflops_per_gpu': 141.0, 'tokens_per_s_per_gpu': None, 'mfu': None, 'step_s': None},
  'notes': "Table 2 gives only 'Model-parallel size' 96; the tp=8 x pp=12 split is an ASSUMPTION (tp=8 within a DGX "
           'node as in every Table 1 multi-node row; 96 layers / 12 stages). dp = gpus/mp = 16 (derived). Schedule not '
           "restated for Table 2: Sec. 5.1 says the end-to-end runs use 'the interleaved pipeline schedule with the "
           "scatter/gather optimization' -> interleaved assumed, number of chunks not given (vp=None). TFLOP/s "
           "convention: F = 96*B*s*l*h^2*(1 + s/(6h) + V/(16*l*h)) per iteration (Eq. 3, GEMMs only, 'assumes "
           'activation recomputation and takes into account the floating-point operations associated with the extra '
           "forward pass', i.e. 4 passes: hardware-FLOPs style, non-causal attention); 'throughput is measured for "
           "end-to-end training'; peak 312 TFLOP/s (A100, 16-bit). mfu field = the table's 'Percentage of theoretical "
           "peak FLOP/s' under that (recompute-inclusive) count."},
 {'id': 'megatron-ptdp-t2-ptdp-529p6b-560gpu-a100',
  'source': 'Narayanan et al. 2021, Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM '
            "(SC'21), Table 2",
  'source_kind': 'paper',
  'quote': '529.6\t280\t2240\t560\t1\t171\t156',
  'model': {'family': 'gpt',
            'layers': 105,
            'hidden': 20480,
            'heads': 128,
            'kv_heads': None,
            'ffn': 81920,
            'vocab': 51200,
            'seq': 2048,
            'params_b': 529.6,
            'hf_config': 'GPT2Config',
            'tied_embeddings': True},
  'hardware': 'a100-80gb',
  'gpus': 560,
  'mesh': {'tp': 8, 'pp': 35, 'dp': 2, 'cp': 1, 'ep': 1, 'vp': None},
  'fsdp': None,
  'sequence_parallel': False,
  'schedule': 'interleaved',
  'micro_batch': 1,
  'global_batch': 2240,
  'recompute': 'full',
  'precision': 'fp16',
  'torch_compile': False,
  'published': {'tflops_per_gpu': 171.0, 'tokens_per_s_per_gpu': None, 'mfu': None, 'step_s': None},
  'notes': 'Model-parallel size 280 = tp 8 x pp 35, the split of the same 529.6B model in Table 1 (derived). dp = '
           "gpus/mp = 2 (derived). Schedule not restated for Table 2: Sec. 5.1 says the end-to-end runs use 'the "
           "interleaved pipeline schedule with the scatter/gather optimization' -> interleaved assumed, number of "
           'chunks not given (vp=None). TFLOP/s convention: F = 96*B*s*l*h^2*(1 + s/(6h) + V/(16*l*h)) per iteration '
           "(Eq. 3, GEMMs only, 'assumes activation recomputation and takes into account the floating-point operations "
           "associated with the extra forward pass', i.e. 4 passes: hardware-FLOPs style, non-causal attention); "
           "'throughput is measured for end-to-end training'; peak 312 TFLOP/s (A100, 16-bit). mfu field = the table's "
           "'Percentage of theoretical peak FLOP/s' under that (recompute-inclusive) count."},
 {'id': 'megatron-ptdp-t2-ptdp-529p6b-1120gpu-a100',
  'source': 'Narayanan et al. 2021, Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM '
            "(SC'21), Table 2",
  'source_kind': 'paper',
  'quote': '1120\t1\t167\t80',
  'model': {'family': 'gpt',
            'layers': 105,
            'hidden': 20480,
            'heads': 128,
            'kv_heads': None,
            'ffn': 81920,
            'vocab': 51200,
            'seq': 2048,
            'params_b': 529.6,
            'hf_config': 'GPT2Config',
            'tied_embeddings': True},
  'hardware': 'a100-80gb',
  'gpus': 1120,
  'mesh': {'tp': 8, 'pp': 35, 'dp': 4, 'cp': 1, 'ep': 1, 'vp': None},
  'fsdp': None,
  'sequence_parallel': False,
  'schedule': 'interleaved',
  'micro_batch': 1,
  'global_batch': 2240,
  'recompute': 'full',
  'precision': 'fp16',
  'torch_compile': False,
  'published': {'tflops_per_gpu': 167.0, 'tokens_per_s_per_gpu': None, 'mfu': None, 'step_s': None},
  'notes': 'Model-parallel size 280 = tp 8 x pp 35, the split of the same 529.6B model in Table 1 (derived). dp = '
           "gpus/mp = 4 (derived). Schedule not restated for Table 2: Sec. 5.1 says the end-to-end runs use 'the "
           "interleaved pipeline schedule with the scatter/gather optimization' -> interleaved assumed, number of "
           'chunks not given (vp=None). TFLOP/s convention: F = 96*B*s*l*h^2*(1 + s/(6h) + V/(16*l*h)) per iteration '
           "(Eq. 3, GEMMs only, 'assumes activation recomputation and takes into account the floating-point operations "
           "associated with the extra forward pass', i.e. 4 passes: hardware-FLOPs style, non-causal attention); "
           "'throughput is measured for end-to-end training'; peak 312 TFLOP/s (A100, 16-bit). mfu field = the table's "
           "'Percentage of theoretical peak FLOP/s' under that (recompute-inclusive) count."},
 {'id': 'megatron-ptdp-t2-ptdp-529p6b-2240gpu-a100',
  'source': 'Narayanan et al. 2021, Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM '
            "(SC'21), Table 2",
  'source_kind': 'paper',
  'quote': '2240\t1\t159\t42',
  'model': {'family': 'gpt',
            'layers': 105,
            'hidden': 20480,
            'heads': 128,
            'kv_heads': None,
            'ffn': 81920,
            'vocab': 51200,
            'seq': 2048,
            'params_b': 529.6,
            'hf_config': 'GPT2Config',
            'tied_embeddings': True},
  'hardware': 'a100-80gb',
  'gpus': 2240,
  'mesh': {'tp': 8, 'pp': 35, 'dp': 8, 'cp': 1, 'ep': 1, 'vp': None},
  'fsdp': None,
  'sequence_parallel': False,
  'schedule': 'interleaved',
  'micro_batch': 1,
  'global_batch': 2240,
  'recompute': 'full',
  'precision': 'fp16',
  'torch_compile': False,
  'published': {'tflops_per_gpu': 159.0, 'tokens_per_s_per_gpu': None, 'mfu': None, 'step_s': None},
  'notes': 'Model-parallel size 280 = tp 8 x pp 35, the split of the same 529.6B model in Table 1 (derived). dp = '
           "gpus/mp = 8 (derived). Schedule not restated for Table 2: Sec. 5.1 says the end-to-end runs use 'the "
           "interleaved pipeline schedule with the scatter/gather optimization' -> interleaved assumed, number of "
           'chunks not given (vp=None). TFLOP/s convention: F = 96*B*s*l*h^2*(1 + s/(6h) + V/(16*l*h)) per iteration '
           "(Eq. 3, GEMMs only, 'assumes activation recomputation and takes into account the floating-point operations "
           "associated with the extra forward pass', i.e. 4 passes: hardware-FLOPs style, non-causal attention); "
           "'throughput is measured for end-to-end training'; peak 312 TFLOP/s (A100, 16-bit). mfu field = the table's "
           "'Percentage of theoretical peak FLOP/s' under that (recompute-inclusive) count."},
 {'id': 'megatron-core-r080-1.7b-h100',
  'source': "NVIDIA/Megatron-LM README.md 'Performance Benchmarking' + images/model_table.png (weak scaling, "
            'Megatron-Core r0.8.0, H100)',
  'source_kind': 'repo',
  'quote': '1.7B | 16 | 2048 | 24 | 1 | 1 | 48 | 48 | 192 | 408.8 | 41% | 19.6',
  'model': {'family': 'gpt',
            'layers': 24,
            'hidden': 2048,
            'heads': 16,
            'kv_heads': None,
            'ffn': 8192,
            'vocab': 131072,
            'seq': 4096,
            'params_b': 1.7,
            'hf_config': 'GPT2Config',
            'tied_embeddings': False},
  'hardware': 'h100',
  'gpus': 48,
  'mesh': {'tp': 1, 'pp': 1, 'dp': 48, 'cp': 1, 'ep': 1, 'vp': 1},
  'fsdp': 'zero1',
  'sequence_parallel': True,
  'schedule': None,
  'micro_batch': None,
  'global_batch': 192,
  'recompute': None,
  'precision': 'bf16',
  'torch_compile': None,
  'published': {'tflops_per_gpu': 408.8, 'tokens_per_s_per_gpu': None, 'mfu': 0.41, 'step_s': None},
  'notes': 'Quote transcribed from the PNG table (the README embeds the table as an image; columns: Model size | '
           'Attention heads | Hidden size | Number of layers | Tensor MP size | Pipeline MP size | Data-parallel size '
           "| Number of GPUs | Batch size | Per-GPU teraFLOP/s | MFU | Aggregate petaFLOP/s). README text: 'All models "
           "use a vocabulary size of 131,072 and a sequence length of 4096', 'fine-grained overlapping of "
           'data-parallel (--overlap-grad-reduce --overlap-param-gather), tensor-parallel (--tp-comm-overlap) and '
           "pipeline-parallel communication', throughputs 'measured for end-to-end training'. Weak-scaling figure "
           "legend: 'Megatron-Core r0.8.0'. DERIVED/ASSUMED: precision is not stated -- MFU = TFLOP/s / 989 (H100 SXM "
           "dense BF16) matches every row (408.8/989 = 41%), so bf16 recorded; fsdp='zero1' because "
           "--overlap-param-gather requires Megatron's distributed optimizer; sequence_parallel=True because "
           '--tp-comm-overlap requires it; schedule (1F1B vs interleaved), micro batch and recompute are not stated '
           "(schedule '1f1b' is Megatron's default without virtual stages -- unverified). ffn = 4h and untied "
           'embeddings inferred from the parameter counts: 12*l*h^2 + 2*V*h gives 1.74B/7.11B/461.5B for the '
           '1.7B/7.1B/462B rows (tied would give 1.48B/6.58B); a SwiGLU MLP with ffn = 8h/3 would give the same '
           'counts. FLOP convention (megatron/training/training.py num_floating_point_operations at tag core_r0.8.0): '
           '12*B*s*l*h^2*(1 + kv/heads + s/h + ffn/h + V/(2*l*h)) per iteration = 3 passes, no recompute term, full '
           '(non-causal) attention, logits included: model FLOPs.'},
 {'id': 'megatron-core-r080-7.1b-h100',
  'source': "NVIDIA/Megatron-LM README.md 'Performance Benchmarking' + images/model_table.png (weak scaling, "
            'Megatron-Core r0.8.0, H100)',
  'source_kind': 'repo',
  'quote': '7.1B | 32 | 4096 | 30 | 2 | 1 | 48 | 96 | 192 | 465.9 | 47% | 44.7',
  'model': {'family': 'gpt',
            'layers': 30,
            'hidden': 4096,
            'heads': 32,
            'kv_heads': None,
            'ffn': 16384,
            'vocab': 131072,
            'seq': 4096,
            'params_b': 7.1,
            'hf_config': 'GPT2Config',
            'tied_embeddings': False},
  'hardware': 'h100',
  'gpus': 96,
  'mesh': {'tp': 2, 'pp': 1, 'dp': 48, 'cp': 1, 'ep': 1, 'vp': 1},
  'fsdp': 'zero1',
  'sequence_parallel': True,
  'schedule': None,
  'micro_batch': None,
  'global_batch': 192,
  'recompute': None,
  'precision': 'bf16',
  'torch_compile': None,
  'published': {'tflops_per_gpu': 465.9, 'tokens_per_s_per_gpu': None, 'mfu': 0.47, 'step_s': None},
  'notes': 'Quote transcribed from the PNG table (the README embeds the table as an image; columns: Model size | '
           'Attention heads | Hidden size | Number of layers | Tensor MP size | Pipeline MP size | Data-parallel size '
           "| Number of GPUs | Batch size | Per-GPU teraFLOP/s | MFU | Aggregate petaFLOP/s). README text: 'All models "
           "use a vocabulary size of 131,072 and a sequence length of 4096', 'fine-grained overlapping of "
           'data-parallel (--overlap-grad-reduce --overlap-param-gather), tensor-parallel (--tp-comm-overlap) and '
           "pipeline-parallel communication', throughputs 'measured for end-to-end training'. Weak-scaling figure "
           "legend: 'Megatron-Core r0.8.0'. DERIVED/ASSUMED: precision is not stated -- MFU = TFLOP/s / 989 (H100 SXM "
           "dense BF16) matches every row (408.8/989 = 41%), so bf16 recorded; fsdp='zero1' because "
           "--overlap-param-gather requires Megatron's distributed optimizer; sequence_parallel=True because "
           '--tp-comm-overlap requires it; schedule (1F1B vs interleaved), micro batch and recompute are not stated '
           "(schedule '1f1b' is Megatron's default without virtual stages -- unverified). ffn = 4h and untied "
           'embeddings inferred from the parameter counts: 12*l*h^2 + 2*V*h gives 1.74B/7.11B/461.5B for the '
           '1.7B/7.1B/462B rows (tied would give 1.48B/6.58B); a SwiGLU MLP with ffn = 8h/3 would give the same '
           'counts. FLOP convention (megatron/training/training.py num_floating_point_operations at tag core_r0.8.0): '
           '12*B*s*l*h^2*(1 + kv/heads + s/h + ffn/h + V/(2*l*h)) per iteration = 3 passes, no recompute term, full '
           '(non-causal) attention, logits included: model FLOPs.'},
 {'id': 'megatron-core-r080-16b-h100',
  'source': "NVIDIA/Megatron-LM README.md 'Performance Benchmarking' + images/model_table.png (weak scaling, "
            'Megatron-Core r0.8.0, H100)',
  'source_kind': 'repo',
  'quote': '16B | 48 | 6144 | 32 | 4 | 1 | 48 | 192 | 192 | 489.1 | 49% | 93.9',
  'model': {'family': 'gpt',
            'layers': 32,
            'hidden': 6144,
            'heads': 48,
            'kv_heads': None,
            'ffn': 24576,
            'vocab': 131072,
            'seq': 4096,
            'params_b': 16.0,
            'hf_config': 'GPT2Config',
            'tied_embeddings': False},
  'hardware': 'h100',
  'gpus': 192,
  'mesh': {'tp': 4, 'pp': 1, 'dp': 48, 'cp': 1, 'ep': 1, 'vp': 1},
  'fsdp': 'zero1',
  'sequence_parallel': True,
  'schedule': None,
  'micro_batch': None,
  'global_batch': 192,
  'recompute': None,
  'precision': 'bf16',
  'torch_compile': None,
  'published': {'tflops_per_gpu': 489.1, 'tokens_per_s_per_gpu': None, 'mfu': 0.49, 'step_s': None},
  'notes': 'Quote transcribed from the PNG table (the README embeds the table as an image; columns: Model size | '
           'Attention heads | Hidden size | Number of layers | Tensor MP size | Pipeline MP size | Data-parallel size '
           "| Number of GPUs | Batch size | Per-GPU teraFLOP/s | MFU | Aggregate petaFLOP/s). README text: 'All models "
           "use a vocabulary size of 131,072 and a sequence length of 4096', 'fine-grained overlapping of "
           'data-parallel (--overlap-grad-reduce --overlap-param-gather), tensor-parallel (--tp-comm-overlap) and '
           "pipeline-parallel communication', throughputs 'measured for end-to-end training'. Weak-scaling figure "
           "legend: 'Megatron-Core r0.8.0'. DERIVED/ASSUMED: precision is not stated -- MFU = TFLOP/s / 989 (H100 SXM "
           "dense BF16) matches every row (408.8/989 = 41%), so bf16 recorded; fsdp='zero1' because "
           "--overlap-param-gather requires Megatron's distributed optimizer; sequence_parallel=True because "
           '--tp-comm-overlap requires it; schedule (1F1B vs interleaved), micro batch and recompute are not stated '
           "(schedule '1f1b' is Megatron's default without virtual stages -- unverified). ffn = 4h and untied "
           'embeddings inferred from the parameter counts: 12*l*h^2 + 2*V*h gives 1.74B/7.11B/461.5B for the '
           '1.7B/7.1B/462B rows (tied would give 1.48B/6.58B); a SwiGLU MLP with ffn = 8h/3 would give the same '
           'counts. FLOP convention (megatron/training/training.py num_floating_point_operations at tag core_r0.8.0): '
           '12*B*s*l*h^2*(1 + kv/heads + s/h + ffn/h + V/(2*l*h)) per iteration = 3 passes, no recompute term, full '
           '(non-causal) attention, logits included: model FLOPs.'},
 {'id': 'megatron-core-r080-32b-h100',
  'source': "NVIDIA/Megatron-LM README.md 'Performance Benchmarking' + images/model_table.png (weak scaling, "
            'Megatron-Core r0.8.0, H100)',
  'source_kind': 'repo',
  'quote': '32B | 56 | 7168 | 48 | 8 | 1 | 48 | 384 | 192 | 459.6 | 46% | 176.5',
  'model': {'family': 'gpt',
            'layers': 48,
            'hidden': 7168,
            'heads': 56,
            'kv_heads': None,
            'ffn': 28672,
            'vocab': 131072,
            'seq': 4096,
            'params_b': 32.0,
            'hf_config': 'GPT2Config',
            'tied_embeddings': False},
  'hardware': 'h100',
  'gpus': 384,
  'mesh': {'tp': 8, 'pp': 1, 'dp': 48, 'cp': 1, 'ep': 1, 'vp': 1},
  'fsdp': 'zero1',
  'sequence_parallel': True,
  'schedule': None,
  'micro_batch': None,
  'global_batch': 192,
  'recompute': None,
  'precision': 'bf16',
  'torch_compile': None,
  'published': {'tflops_per_gpu': 459.6, 'tokens_per_s_per_gpu': None, 'mfu': 0.46, 'step_s': None},
  'notes': 'Quote transcribed from the PNG table (the README embeds the table as an image; columns: Model size | '
           'Attention heads | Hidden size | Number of layers | Tensor MP size | Pipeline MP size | Data-parallel size '
           "| Number of GPUs | Batch size | Per-GPU teraFLOP/s | MFU | Aggregate petaFLOP/s). README text: 'All models "
           "use a vocabulary size of 131,072 and a sequence length of 4096', 'fine-grained overlapping of "
           'data-parallel (--overlap-grad-reduce --overlap-param-gather), tensor-parallel (--tp-comm-overlap) and '
           "pipeline-parallel communication', throughputs 'measured for end-to-end training'. Weak-scaling figure "
           "legend: 'Megatron-Core r0.8.0'. DERIVED/ASSUMED: precision is not stated -- MFU = TFLOP/s / 989 (H100 SXM "
           "dense BF16) matches every row (408.8/989 = 41%), so bf16 recorded; fsdp='zero1' because "
           "--overlap-param-gather requires Megatron's distributed optimizer; sequence_parallel=True because "
           '--tp-comm-overlap requires it; schedule (1F1B vs interleaved), micro batch and recompute are not stated '
           "(schedule '1f1b' is Megatron's default without virtual stages -- unverified). ffn = 4h and untied "
           'embeddings inferred from the parameter counts: 12*l*h^2 + 2*V*h gives 1.74B/7.11B/461.5B for the '
           '1.7B/7.1B/462B rows (tied would give 1.48B/6.58B); a SwiGLU MLP with ffn = 8h/3 would give the same '
           'counts. FLOP convention (megatron/training/training.py num_floating_point_operations at tag core_r0.8.0): '
           '12*B*s*l*h^2*(1 + kv/heads + s/h + ffn/h + V/(2*l*h)) per iteration = 3 passes, no recompute term, full '
           '(non-causal) attention, logits included: model FLOPs.'},
 {'id': 'megatron-core-r080-70b-h100',
  'source': "NVIDIA/Megatron-LM README.md 'Performance Benchmarking' + images/model_table.png (weak scaling, "
            'Megatron-Core r0.8.0, H100)',
  'source_kind': 'repo',
  'quote': '70B | 64 | 8192 | 84 | 8 | 2 | 48 | 768 | 384 | 419.7 | 42% | 322.3',
  'model': {'family': 'gpt',
            'layers': 84,
            'hidden': 8192,
            'heads': 64,
            'kv_heads': None,
            'ffn': 32768,
            'vocab': 131072,
            'seq': 4096,
            'params_b': 70.0,
            'hf_config': 'GPT2Config',
            'tied_embeddings': False},
  'hardware': 'h100',
  'gpus': 768,
  'mesh': {'tp': 8, 'pp': 2, 'dp': 48, 'cp': 1, 'ep': 1, 'vp': None},
  'fsdp': 'zero1',
  'sequence_parallel': True,
  'schedule': '1f1b',
  'micro_batch': None,
  'global_batch': 384,
  'recompute': None,
  'precision': 'bf16',
  'torch_compile': None,
  'published': {'tflops_per_gpu': 419.7, 'tokens_per_s_per_gpu': None, 'mfu': 0.42, 'step_s': None},
  'notes': 'Quote transcribed from the PNG table (the README embeds the table as an image; columns: Model size | '
           'Attention heads | Hidden size | Number of layers | Tensor MP size | Pipeline MP size | Data-parallel size '
           "| Number of GPUs | Batch size | Per-GPU teraFLOP/s | MFU | Aggregate petaFLOP/s). README text: 'All models "
           "use a vocabulary size of 131,072 and a sequence length of 4096', 'fine-grained overlapping of "
           'data-parallel (--overlap-grad-reduce --overlap-param-gather), tensor-parallel (--tp-comm-overlap) and '
           "pipeline-parallel communication', throughputs 'measured for end-to-end training'. Weak-scaling figure "
           "legend: 'Megatron-Core r0.8.0'. DERIVED/ASSUMED: precision is not stated -- MFU = TFLOP/s / 989 (H100 SXM "
           "dense BF16) matches every row (408.8/989 = 41%), so bf16 recorded; fsdp='zero1' because "
           "--overlap-param-gather requires Megatron's distributed optimizer; sequence_parallel=True because "
           '--tp-comm-overlap requires it; schedule (1F1B vs interleaved), micro batch and recompute are not stated '
           "(schedule '1f1b' is Megatron's default without virtual stages -- unverified). ffn = 4h and untied "
           'embeddings inferred from the parameter counts: 12*l*h^2 + 2*V*h gives 1.74B/7.11B/461.5B for the '
           '1.7B/7.1B/462B rows (tied would give 1.48B/6.58B); a SwiGLU MLP with ffn = 8h/3 would give the same '
           'counts. FLOP convention (megatron/training/training.py num_floating_point_operations at tag core_r0.8.0): '
           '12*B*s*l*h^2*(1 + kv/heads + s/h + ffn/h + V/(2*l*h)) per iteration = 3 passes, no recompute term, full '
           '(non-causal) attention, logits included: model FLOPs.'},
 {'id': 'megatron-core-r080-119b-h100',
  'source': "NVIDIA/Megatron-LM README.md 'Performance Benchmarking' + images/model_table.png (weak scaling, "
            'Megatron-Core r0.8.0, H100)',
  'source_kind': 'repo',
  'quote': '119B | 80 | 10240 | 92 | 8 | 4 | 48 | 1536 | 768 | 420.5 | 43% | 645.9',
  'model': {'family': 'gpt',
            'layers': 92,
            'hidden': 10240,
            'heads': 80,
            'kv_heads': None,
            'ffn': 40960,
            'vocab': 131072,
            'seq': 4096,
            'params_b': 119.0,
            'hf_config': 'GPT2Config',
            'tied_embeddings': False},
  'hardware': 'h100',
  'gpus': 1536,
  'mesh': {'tp': 8, 'pp': 4, 'dp': 48, 'cp': 1, 'ep': 1, 'vp': None},
  'fsdp': 'zero1',
  'sequence_parallel': True,
  'schedule': '1f1b',
  'micro_batch': None,
  'global_batch': 768,
  'recompute': None,
  'precision': 'bf16',
  'torch_compile': None,
  'published': {'tflops_per_gpu': 420.5, 'tokens_per_s_per_gpu': None, 'mfu': 0.43, 'step_s': None},
  'notes': 'Quote transcribed from the PNG table (the README embeds the table as an image; columns: Model size | '
           'Attention heads | Hidden size | Number of layers | Tensor MP size | Pipeline MP size | Data-parallel size '
           "| Number of GPUs | Batch size | Per-GPU teraFLOP/s | MFU | Aggregate petaFLOP/s). README text: 'All models "
           "use a vocabulary size of 131,072 and a sequence length of 4096', 'fine-grained overlapping of "
           'data-parallel (--overlap-grad-reduce --overlap-param-gather), tensor-parallel (--tp-comm-overlap) and '
           "pipeline-parallel communication', throughputs 'measured for end-to-end training'. Weak-scaling figure "
           "legend: 'Megatron-Core r0.8.0'. DERIVED/ASSUMED: precision is not stated -- MFU = TFLOP/s / 989 (H100 SXM "
           "dense BF16) matches every row (408.8/989 = 41%), so bf16 recorded; fsdp='zero1' because "
           "--overlap-param-gather requires Megatron's distributed optimizer; sequence_parallel=True because "
           '--tp-comm-overlap requires it; schedule (1F1B vs interleaved), micro batch and recompute are not stated '
           "(schedule '1f1b' is Megatron's default without virtual stages -- unverified). ffn = 4h and untied "
           'embeddings inferred from the parameter counts: 12*l*h^2 + 2*V*h gives 1.74B/7.11B/461.5B for the '
           '1.7B/7.1B/462B rows (tied would give 1.48B/6.58B); a SwiGLU MLP with ffn = 8h/3 would give the same '
           'counts. FLOP convention (megatron/training/training.py num_floating_point_operations at tag core_r0.8.0): '
           '12*B*s*l*h^2*(1 + kv/heads + s/h + ffn/h + V/(2*l*h)) per iteration = 3 passes, no recompute term, full '
           '(non-causal) attention, logits included: model FLOPs.'},
 {'id': 'megatron-core-r080-177b-h100',
  'source': "NVIDIA/Megatron-LM README.md 'Performance Benchmarking' + images/model_table.png (weak scaling, "
            'Megatron-Core r0.8.0, H100)',
  'source_kind': 'repo',
  'quote': '177B | 96 | 12288 | 96 | 8 | 6 | 48 | 2304 | 1152 | 432.8 | 44% | 997.2',
  'model': {'family': 'gpt',
            'layers': 96,
            'hidden': 12288,
            'heads': 96,
            'kv_heads': None,
            'ffn': 49152,
            'vocab': 131072,
            'seq': 4096,
            'params_b': 177.0,
            'hf_config': 'GPT2Config',
            'tied_embeddings': False},
  'hardware': 'h100',
  'gpus': 2304,
  'mesh': {'tp': 8, 'pp': 6, 'dp': 48, 'cp': 1, 'ep': 1, 'vp': None},
  'fsdp': 'zero1',
  'sequence_parallel': True,
  'schedule': '1f1b',
  'micro_batch': None,
  'global_batch': 1152,
  'recompute': None,
  'precision': 'bf16',
  'torch_compile': None,
  'published': {'tflops_per_gpu': 432.8, 'tokens_per_s_per_gpu': None, 'mfu': 0.44, 'step_s': None},
  'notes': 'Quote transcribed from the PNG table (the README embeds the table as an image; columns: Model size | '
           'Attention heads | Hidden size | Number of layers | Tensor MP size | Pipeline MP size | Data-parallel size '
           "| Number of GPUs | Batch size | Per-GPU teraFLOP/s | MFU | Aggregate petaFLOP/s). README text: 'All models "
           "use a vocabulary size of 131,072 and a sequence length of 4096', 'fine-grained overlapping of "
           'data-parallel (--overlap-grad-reduce --overlap-param-gather), tensor-parallel (--tp-comm-overlap) and '
           "pipeline-parallel communication', throughputs 'measured for end-to-end training'. Weak-scaling figure "
           "legend: 'Megatron-Core r0.8.0'. DERIVED/ASSUMED: precision is not stated -- MFU = TFLOP/s / 989 (H100 SXM "
           "dense BF16) matches every row (408.8/989 = 41%), so bf16 recorded; fsdp='zero1' because "
           "--overlap-param-gather requires Megatron's distributed optimizer; sequence_parallel=True because "
           '--tp-comm-overlap requires it; schedule (1F1B vs interleaved), micro batch and recompute are not stated '
           "(schedule '1f1b' is Megatron's default without virtual stages -- unverified). ffn = 4h and untied "
           'embeddings inferred from the parameter counts: 12*l*h^2 + 2*V*h gives 1.74B/7.11B/461.5B for the '
           '1.7B/7.1B/462B rows (tied would give 1.48B/6.58B); a SwiGLU MLP with ffn = 8h/3 would give the same '
           'counts. FLOP convention (megatron/training/training.py num_floating_point_operations at tag core_r0.8.0): '
           '12*B*s*l*h^2*(1 + kv/heads + s/h + ffn/h + V/(2*l*h)) per iteration = 3 passes, no recompute term, full '
           '(non-causal) attention, logits included: model FLOPs.'},
 {'id': 'megatron-core-r080-314b-h100',
  'source': "NVIDIA/Megatron-LM README.md 'Performance Benchmarking' + images/model_table.png (weak scaling, "
            'Megatron-Core r0.8.0, H100)',
  'source_kind': 'repo',
  'quote': '314B | 128 | 16384 | 96 | 8 | 8 | 48 | 3072 | 1536 | 474.4 | 48% | 1457.4',
  'model': {'family': 'gpt',
            'layers': 96,
            'hidden': 16384,
            'heads': 128,
            'kv_heads': None,
            'ffn': 65536,
            'vocab': 131072,
            'seq': 4096,
            'params_b': 314.0,
            'hf_config': 'GPT2Config',
            'tied_embeddings': False},
  'hardware': 'h100',
  'gpus': 3072,
  'mesh': {'tp': 8, 'pp': 8, 'dp': 48, 'cp': 1, 'ep': 1, 'vp': None},
  'fsdp': 'zero1',
  'sequence_parallel': True,
  'schedule': '1f1b',
  'micro_batch': None,
  'global_batch': 1536,
  'recompute': None,
  'precision': 'bf16',
  'torch_compile': None,
  'published': {'tflops_per_gpu': 474.4, 'tokens_per_s_per_gpu': None, 'mfu': 0.48, 'step_s': None},
  'notes': 'Quote transcribed from the PNG table (the README embeds the table as an image; columns: Model size | '
           'Attention heads | Hidden size | Number of layers | Tensor MP size | Pipeline MP size | Data-parallel size '
           "| Number of GPUs | Batch size | Per-GPU teraFLOP/s | MFU | Aggregate petaFLOP/s). README text: 'All models "
           "use a vocabulary size of 131,072 and a sequence length of 4096', 'fine-grained overlapping of "
           'data-parallel (--overlap-grad-reduce --overlap-param-gather), tensor-parallel (--tp-comm-overlap) and '
           "pipeline-parallel communication', throughputs 'measured for end-to-end training'. Weak-scaling figure "
           "legend: 'Megatron-Core r0.8.0'. DERIVED/ASSUMED: precision is not stated -- MFU = TFLOP/s / 989 (H100 SXM "
           "dense BF16) matches every row (408.8/989 = 41%), so bf16 recorded; fsdp='zero1' because "
           "--overlap-param-gather requires Megatron's distributed optimizer; sequence_parallel=True because "
           '--tp-comm-overlap requires it; schedule (1F1B vs interleaved), micro batch and recompute are not stated '
           "(schedule '1f1b' is Megatron's default without virtual stages -- unverified). ffn = 4h and untied "
           'embeddings inferred from the parameter counts: 12*l*h^2 + 2*V*h gives 1.74B/7.11B/461.5B for the '
           '1.7B/7.1B/462B rows (tied would give 1.48B/6.58B); a SwiGLU MLP with ffn = 8h/3 would give the same '
           'counts. FLOP convention (megatron/training/training.py num_floating_point_operations at tag core_r0.8.0): '
           '12*B*s*l*h^2*(1 + kv/heads + s/h + ffn/h + V/(2*l*h)) per iteration = 3 passes, no recompute term, full '
           '(non-causal) attention, logits included: model FLOPs.'},
 {'id': 'megatron-core-r080-462b-h100',
  'source': "NVIDIA/Megatron-LM README.md 'Performance Benchmarking' + images/model_table.png (weak scaling, "
            'Megatron-Core r0.8.0, H100)',
  'source_kind': 'repo',
  'quote': '462B | 144 | 18432 | 112 | 8 | 16 | 48 | 6144 | 3072 | 459.9 | 47% | 2825.6',
  'model': {'family': 'gpt',
            'layers': 112,
            'hidden': 18432,
            'heads': 144,
            'kv_heads': None,
            'ffn': 73728,
            'vocab': 131072,
            'seq': 4096,
            'params_b': 462.0,
            'hf_config': 'GPT2Config',
            'tied_embeddings': False},
  'hardware': 'h100',
  'gpus': 6144,
  'mesh': {'tp': 8, 'pp': 16, 'dp': 48, 'cp': 1, 'ep': 1, 'vp': None},
  'fsdp': 'zero1',
  'sequence_parallel': True,
  'schedule': '1f1b',
  'micro_batch': None,
  'global_batch': 3072,
  'recompute': None,
  'precision': 'bf16',
  'torch_compile': None,
  'published': {'tflops_per_gpu': 459.9, 'tokens_per_s_per_gpu': None, 'mfu': 0.47, 'step_s': None},
  'notes': 'Quote transcribed from the PNG table (the README embeds the table as an image; columns: Model size | '
           'Attention heads | Hidden size | Number of layers | Tensor MP size | Pipeline MP size | Data-parallel size '
           "| Number of GPUs | Batch size | Per-GPU teraFLOP/s | MFU | Aggregate petaFLOP/s). README text: 'All models "
           "use a vocabulary size of 131,072 and a sequence length of 4096', 'fine-grained overlapping of "
           'data-parallel (--overlap-grad-reduce --overlap-param-gather), tensor-parallel (--tp-comm-overlap) and '
           "pipeline-parallel communication', throughputs 'measured for end-to-end training'. Weak-scaling figure "
           "legend: 'Megatron-Core r0.8.0'. DERIVED/ASSUMED: precision is not stated -- MFU = TFLOP/s / 989 (H100 SXM "
           "dense BF16) matches every row (408.8/989 = 41%), so bf16 recorded; fsdp='zero1' because "
           "--overlap-param-gather requires Megatron's distributed optimizer; sequence_parallel=True because "
           '--tp-comm-overlap requires it; schedule (1F1B vs interleaved), micro batch and recompute are not stated '
           "(schedule '1f1b' is Megatron's default without virtual stages -- unverified). ffn = 4h and untied "
           'embeddings inferred from the parameter counts: 12*l*h^2 + 2*V*h gives 1.74B/7.11B/461.5B for the '
           '1.7B/7.1B/462B rows (tied would give 1.48B/6.58B); a SwiGLU MLP with ffn = 8h/3 would give the same '
           'counts. FLOP convention (megatron/training/training.py num_floating_point_operations at tag core_r0.8.0): '
           '12*B*s*l*h^2*(1 + kv/heads + s/h + ffn/h + V/(2*l*h)) per iteration = 3 passes, no recompute term, full '
           '(non-causal) attention, logits included: model FLOPs.'},
 {'id': 'llama3-405b-8k-8192gpu-h100',
  'source': 'Llama Team, AI @ Meta 2024, The Llama 3 Herd of Models (arXiv:2407.21783), Sec. 3.3.2, Table 4',
  'source_kind': 'paper',
  'quote': '8,192 | 8 | 1 | 16 | 64 | 8,192 | 32 | 16M | 430 | 43%',
  'model': {'family': 'llama',
            'layers': 126,
            'hidden': 16384,
            'heads': 128,
            'kv_heads': 8,
            'ffn': 53248,
            'vocab': 128256,
            'seq': 8192,
            'params_b': 405.0,
            'hf_config': 'LlamaConfig',
            'tied_embeddings': False},
  'hardware': 'h100',
  'gpus': 8192,
  'mesh': {'tp': 8, 'pp': 16, 'dp': 64, 'cp': 1, 'ep': 1, 'vp': None},
  'fsdp': 'zero2',
  'sequence_parallel': None,
  'schedule': 'interleaved',
  'micro_batch': None,
  'global_batch': 2048,
  'recompute': 'none',
  'precision': 'bf16',
  'torch_compile': None,
  'published': {'tflops_per_gpu': 430.0, 'tokens_per_s_per_gpu': None, 'mfu': 0.43, 'step_s': None},
  'notes': 'H100 80GB HBM3 at 700W (Grand Teton, 8 GPUs/server on NVLink); 405B used RoCE, 400 Gbps per GPU; '
           'three-layer Clos, pods of 3,072 GPUs at full bisection, 1:7 oversubscription above. global_batch = DP * '
           "'Batch size/DP' (derived); Tokens/Batch = 16M. 'DP stands for FSDP'; 'Our use of FSDP for Llama 3 shards "
           "optimizer states and gradients, but for model shards we do not reshard after forward computation' -> "
           "recorded as zero2. Pipeline: 'we use an interleaved schedule (Narayanan et al., 2021) with V pipeline "
           "stages on one pipeline rank' with tunable N contiguous micro-batches; first and last stage have one "
           "transformer layer fewer; V and micro-batch size not published. 'we could pre-train Llama 3 on sequences of "
           "8K tokens without activation checkpointing' (8K rows: recompute none). 'BF16 Model FLOPs Utilization (MFU; "
           "Chowdhery et al. (2023))' -- exact FLOP count (attention, causal or not) not given; 430/0.43 ~ 1000 "
           "TFLOP/s implies the ~989 dense BF16 H100 peak. Document mask attention. Architecture from the same paper's "
           'Table 3 (405B: 126 layers, model dim 16,384, FFN 14,336/28,672/53,248 for 8B/70B/405B -> 53,248, 128 '
           "heads, 8 KV heads, SwiGLU, RoPE theta 500,000, 'Vocabulary Size 128,000'); vocab recorded as 128,256 "
           "(torchtitan/models/llama3/__init__.py 'vocab_size = 128256', the tokenizer's actual size). Untied "
           'embeddings (LlamaConfig default for Llama 3.1 405B).'},
 {'id': 'llama3-405b-8k-16384gpu-h100',
  'source': 'Llama Team, AI @ Meta 2024, The Llama 3 Herd of Models (arXiv:2407.21783), Sec. 3.3.2, Table 4',
  'source_kind': 'paper',
  'quote': '16,384 | 8 | 1 | 16 | 128 | 8,192 | 16 | 16M | 400 | 41%',
  'model': {'family': 'llama',
            'layers': 126,
            'hidden': 16384,
            'heads': 128,
            'kv_heads': 8,
            'ffn': 53248,
            'vocab': 128256,
            'seq': 8192,
            'params_b': 405.0,
            'hf_config': 'LlamaConfig',
            'tied_embeddings': False},
  'hardware': 'h100',
  'gpus': 16384,
  'mesh': {'tp': 8, 'pp': 16, 'dp': 128, 'cp': 1, 'ep': 1, 'vp': None},
  'fsdp': 'zero2',
  'sequence_parallel': None,
  'schedule': 'interleaved',
  'micro_batch': None,
  'global_batch': 2048,
  'recompute': 'none',
  'precision': 'bf16',
  'torch_compile': None,
  'published': {'tflops_per_gpu': 400.0, 'tokens_per_s_per_gpu': None, 'mfu': 0.41, 'step_s': None},
  'notes': 'H100 80GB HBM3 at 700W (Grand Teton, 8 GPUs/server on NVLink); 405B used RoCE, 400 Gbps per GPU; '
           'three-layer Clos, pods of 3,072 GPUs at full bisection, 1:7 oversubscription above. global_batch = DP * '
           "'Batch size/DP' (derived); Tokens/Batch = 16M. 'DP stands for FSDP'; 'Our use of FSDP for Llama 3 shards "
           "optimizer states and gradients, but for model shards we do not reshard after forward computation' -> "
           "recorded as zero2. Pipeline: 'we use an interleaved schedule (Narayanan et al., 2021) with V pipeline "
           "stages on one pipeline rank' with tunable N contiguous micro-batches; first and last stage have one "
           "transformer layer fewer; V and micro-batch size not published. 'we could pre-train Llama 3 on sequences of "
           "8K tokens without activation checkpointing' (8K rows: recompute none). 'BF16 Model FLOPs Utilization (MFU; "
           "Chowdhery et al. (2023))' -- exact FLOP count (attention, causal or not) not given; 430/0.43 ~ 1000 "
           "TFLOP/s implies the ~989 dense BF16 H100 peak. Document mask attention. Architecture from the same paper's "
           'Table 3 (405B: 126 layers, model dim 16,384, FFN 14,336/28,672/53,248 for 8B/70B/405B -> 53,248, 128 '
           "heads, 8 KV heads, SwiGLU, RoPE theta 500,000, 'Vocabulary Size 128,000'); vocab recorded as 128,256 "
           "(torchtitan/models/llama3/__init__.py 'vocab_size = 128256', the tokenizer's actual size). Untied "
           'embeddings (LlamaConfig default for Llama 3.1 405B).'},
 {'id': 'llama3-405b-128k-16384gpu-h100',
  'source': 'Llama Team, AI @ Meta 2024, The Llama 3 Herd of Models (arXiv:2407.21783), Sec. 3.3.2, Table 4',
  'source_kind': 'paper',
  'quote': '16,384 | 8 | 16 | 16 | 8 | 131,072 | 16 | 16M | 380 | 38%',
  'model': {'family': 'llama',
            'layers': 126,
            'hidden': 16384,
            'heads': 128,
            'kv_heads': 8,
            'ffn': 53248,
            'vocab': 128256,
            'seq': 131072,
            'params_b': 405.0,
            'hf_config': 'LlamaConfig',
            'tied_embeddings': False},
  'hardware': 'h100',
  'gpus': 16384,
  'mesh': {'tp': 8, 'pp': 16, 'dp': 8, 'cp': 16, 'ep': 1, 'vp': None},
  'fsdp': 'zero2',
  'sequence_parallel': None,
  'schedule': 'interleaved',
  'micro_batch': None,
  'global_batch': 128,
  'recompute': None,
  'precision': 'bf16',
  'torch_compile': None,
  'published': {'tflops_per_gpu': 380.0, 'tokens_per_s_per_gpu': None, 'mfu': 0.38, 'step_s': None},
  'notes': 'DP for this row: the arXiv v3 PDF text reads 8, while some earlier renderings of the table read 4; 8 is '
           'the value consistent with 16,384 = 8*16*16*DP and with 16M tokens/batch = DP*16*131,072. CP is all-gather '
           'based (K/V all-gathered, sequence split in 2*CP chunks for load balance). Whether activation checkpointing '
           'was used at 128K is not stated. H100 80GB HBM3 at 700W (Grand Teton, 8 GPUs/server on NVLink); 405B used '
           'RoCE, 400 Gbps per GPU; three-layer Clos, pods of 3,072 GPUs at full bisection, 1:7 oversubscription '
           "above. global_batch = DP * 'Batch size/DP' (derived); Tokens/Batch = 16M. 'DP stands for FSDP'; 'Our use "
           'of FSDP for Llama 3 shards optimizer states and gradients, but for model shards we do not reshard after '
           "forward computation' -> recorded as zero2. Pipeline: 'we use an interleaved schedule (Narayanan et al., "
           "2021) with V pipeline stages on one pipeline rank' with tunable N contiguous micro-batches; first and last "
           "stage have one transformer layer fewer; V and micro-batch size not published. 'we could pre-train Llama 3 "
           "on sequences of 8K tokens without activation checkpointing' (8K rows: recompute none). 'BF16 Model FLOPs "
           "Utilization (MFU; Chowdhery et al. (2023))' -- exact FLOP count (attention, causal or not) not given; "
           '430/0.43 ~ 1000 TFLOP/s implies the ~989 dense BF16 H100 peak. Document mask attention. Architecture from '
           "the same paper's Table 3 (405B: 126 layers, model dim 16,384, FFN 14,336/28,672/53,248 for 8B/70B/405B -> "
           "53,248, 128 heads, 8 KV heads, SwiGLU, RoPE theta 500,000, 'Vocabulary Size 128,000'); vocab recorded as "
           "128,256 (torchtitan/models/llama3/__init__.py 'vocab_size = 128256', the tokenizer's actual size). Untied "
           'embeddings (LlamaConfig default for Llama 3.1 405B).'},
 {'id': 'torchtitan-202412-t1-llama31-8b-fsdp8-h100',
  'source': 'pytorch/torchtitan benchmarks/llama3_h100_202412_torchtitan.md, Table 1',
  'source_kind': 'repo',
  'quote': '| FSDP | 5,762 | 82.4 |',
  'model': {'family': 'llama',
            'layers': 32,
            'hidden': 4096,
            'heads': 32,
            'kv_heads': 8,
            'ffn': 14336,
            'vocab': 128256,
            'seq': 8192,
            'params_b': 8.0,
            'hf_config': 'LlamaConfig',
            'tied_embeddings': False},
  'hardware': 'h100',
  'gpus': 8,
  'mesh': {'tp': 1, 'pp': 1, 'dp': 8, 'cp': 1, 'ep': 1, 'vp': 1},
  'fsdp': 'fsdp',
  'sequence_parallel': False,
  'schedule': None,
  'micro_batch': 2,
  'global_batch': 16,
  'recompute': 'selective',
  'precision': 'bf16',
  'torch_compile': False,
  'published': {'tflops_per_gpu': None, 'tokens_per_s_per_gpu': 5762.0, 'mfu': None, 'step_s': None},
  'notes': "Table 1: '1D Parallelism (FSDP). Llama 3.1 8B model. 8 GPUs. Local batch size 2, global batch size 16. "
           "Selective activation checkpointing.' Memory column (GiB) is the 3rd value. TPS/GPU read at iteration 90. "
           "seq 8192 and selective_ac_option='op' from train_configs/llama3_8b.toml at the benchmarked torchtitan "
           'commit 9dec370 (2024-12-26); FSDP2 mixed precision param bf16, reduce fp32 (config_manager defaults at '
           "that commit). The file says the 1D 8B runs without Float8 reach '33% to 39% MFU' (with/without "
           'torch.compile order as written) but gives no per-row MFU. Float8 rows of the same tables are excluded. '
           "Grand Teton: 8 H100 per host on NVLink, 'Each H100 GPU is equipped with 96GB HBM2e with 2.4 TB/sec', 400 "
           "Gb/s RDMA per GPU, 'default 500W power limit' (a lower-TDP H100 than the 700W SXM). Sizes from "
           "torchtitan's llama3 ModelArgs (8B: dim 4096, 32 layers, 32 heads, 8 kv, ffn_dim_multiplier 1.3, "
           'multiple_of 1024 -> ffn 14336; 70B: dim 8192, 80 layers, 64 heads, 8 kv, 1.3, 4096 -> 28672; 405B: 16384, '
           '126, 128, 8, 1.2, 4096 -> 53248), vocab 128256, untied output projection; these match Llama 3 paper Table '
           '3.'},
 {'id': 'torchtitan-202412-t1-llama31-8b-fsdp8-compile-h100',
  'source': 'pytorch/torchtitan benchmarks/llama3_h100_202412_torchtitan.md, Table 1',
  'source_kind': 'repo',
  'quote': '| FSDP + torch.compile | 6,667 | 77.0 |',
  'model': {'family': 'llama',
            'layers': 32,
            'hidden': 4096,
            'heads': 32,
            'kv_heads': 8,
            'ffn': 14336,
            'vocab': 128256,
            'seq': 8192,
            'params_b': 8.0,
            'hf_config': 'LlamaConfig',
            'tied_embeddings': False},
  'hardware': 'h100',
  'gpus': 8,
  'mesh': {'tp': 1, 'pp': 1, 'dp': 8, 'cp': 1, 'ep': 1, 'vp': 1},
  'fsdp': 'fsdp',
  'sequence_parallel': False,
  'schedule': None,
  'micro_batch': 2,
  'global_batch': 16,
  'recompute': 'selective',
  'precision': 'bf16',
  'torch_compile': True,
  'published': {'tflops_per_gpu': None, 'tokens_per_s_per_gpu': 6667.0, 'mfu': None, 'step_s': None},
  'notes': "Table 1: '1D Parallelism (FSDP). Llama 3.1 8B model. 8 GPUs. Local batch size 2, global batch size 16. "
           "Selective activation checkpointing.' Memory column (GiB) is the 3rd value. TPS/GPU read at iteration 90. "
           "seq 8192 and selective_ac_option='op' from train_configs/llama3_8b.toml at the benchmarked torchtitan "
           'commit 9dec370 (2024-12-26); FSDP2 mixed precision param bf16, reduce fp32 (config_manager defaults at '
           "that commit). The file says the 1D 8B runs without Float8 reach '33% to 39% MFU' (with/without "
           'torch.compile order as written) but gives no per-row MFU. Float8 rows of the same tables are excluded. '
           "Grand Teton: 8 H100 per host on NVLink, 'Each H100 GPU is equipped with 96GB HBM2e with 2.4 TB/sec', 400 "
           "Gb/s RDMA per GPU, 'default 500W power limit' (a lower-TDP H100 than the 700W SXM). Sizes from "
           "torchtitan's llama3 ModelArgs (8B: dim 4096, 32 layers, 32 heads, 8 kv, ffn_dim_multiplier 1.3, "
           'multiple_of 1024 -> ffn 14336; 70B: dim 8192, 80 layers, 64 heads, 8 kv, 1.3, 4096 -> 28672; 405B: 16384, '
           '126, 128, 8, 1.2, 4096 -> 53248), vocab 128256, untied output projection; these match Llama 3 paper Table '
           '3.'},
 {'id': 'torchtitan-202412-t3-llama31-8b-fsdp128-h100',
  'source': 'pytorch/torchtitan benchmarks/llama3_h100_202412_torchtitan.md, Table 3',
  'source_kind': 'repo',
  'quote': '| FSDP | 5,605 | 67.0 |',
  'model': {'family': 'llama',
            'layers': 32,
            'hidden': 4096,
            'heads': 32,
            'kv_heads': 8,
            'ffn': 14336,
            'vocab': 128256,
            'seq': 8192,
            'params_b': 8.0,
            'hf_config': 'LlamaConfig',
            'tied_embeddings': False},
  'hardware': 'h100',
  'gpus': 128,
  'mesh': {'tp': 1, 'pp': 1, 'dp': 128, 'cp': 1, 'ep': 1, 'vp': 1},
  'fsdp': 'fsdp',
  'sequence_parallel': False,
  'schedule': None,
  'micro_batch': 2,
  'global_batch': 256,
  'recompute': 'selective',
  'precision': 'bf16',
  'torch_compile': False,
  'published': {'tflops_per_gpu': None, 'tokens_per_s_per_gpu': 5605.0, 'mfu': None, 'step_s': None},
  'notes': "Table 3: '1D Parallelism (FSDP). Llama 3.1 8B model. 128 GPUs. Local batch size 2, global batch size 256. "
           "Selective activation checkpointing.' Memory column (GiB) is the 3rd value. TPS/GPU read at iteration 90. "
           "seq 8192 and selective_ac_option='op' from train_configs/llama3_8b.toml at the benchmarked torchtitan "
           'commit 9dec370 (2024-12-26); FSDP2 mixed precision param bf16, reduce fp32 (config_manager defaults at '
           "that commit). The file says the 1D 8B runs without Float8 reach '33% to 39% MFU' (with/without "
           'torch.compile order as written) but gives no per-row MFU. Float8 rows of the same tables are excluded. '
           "Grand Teton: 8 H100 per host on NVLink, 'Each H100 GPU is equipped with 96GB HBM2e with 2.4 TB/sec', 400 "
           "Gb/s RDMA per GPU, 'default 500W power limit' (a lower-TDP H100 than the 700W SXM). Sizes from "
           "torchtitan's llama3 ModelArgs (8B: dim 4096, 32 layers, 32 heads, 8 kv, ffn_dim_multiplier 1.3, "
           'multiple_of 1024 -> ffn 14336; 70B: dim 8192, 80 layers, 64 heads, 8 kv, 1.3, 4096 -> 28672; 405B: 16384, '
           '126, 128, 8, 1.2, 4096 -> 53248), vocab 128256, untied output projection; these match Llama 3 paper Table '
           '3.'},
 {'id': 'torchtitan-202412-t3-llama31-8b-fsdp128-compile-h100',
  'source': 'pytorch/torchtitan benchmarks/llama3_h100_202412_torchtitan.md, Table 3',
  'source_kind': 'repo',
  'quote': '| FSDP + torch.compile | 6,514 | 62.0 |',
  'model': {'family': 'llama',
            'layers': 32,
            'hidden': 4096,
            'heads': 32,
            'kv_heads': 8,
            'ffn': 14336,
            'vocab': 128256,
            'seq': 8192,
            'params_b': 8.0,
            'hf_config': 'LlamaConfig',
            'tied_embeddings': False},
  'hardware': 'h100',
  'gpus': 128,
  'mesh': {'tp': 1, 'pp': 1, 'dp': 128, 'cp': 1, 'ep': 1, 'vp': 1},
  'fsdp': 'fsdp',
  'sequence_parallel': False,
  'schedule': None,
  'micro_batch': 2,
  'global_batch': 256,
  'recompute': 'selective',
  'precision': 'bf16',
  'torch_compile': True,
  'published': {'tflops_per_gpu': None, 'tokens_per_s_per_gpu': 6514.0, 'mfu': None, 'step_s': None},
  'notes': "Table 3: '1D Parallelism (FSDP). Llama 3.1 8B model. 128 GPUs. Local batch size 2, global batch size 256. "
           "Selective activation checkpointing.' Memory column (GiB) is the 3rd value. TPS/GPU read at iteration 90. "
           "seq 8192 and selective_ac_option='op' from train_configs/llama3_8b.toml at the benchmarked torchtitan "
           'commit 9dec370 (2024-12-26); FSDP2 mixed precision param bf16, reduce fp32 (config_manager defaults at '
           "that commit). The file says the 1D 8B runs without Float8 reach '33% to 39% MFU' (with/without "
           'torch.compile order as written) but gives no per-row MFU. Float8 rows of the same tables are excluded. '
           "Grand Teton: 8 H100 per host on NVLink, 'Each H100 GPU is equipped with 96GB HBM2e with 2.4 TB/sec', 400 "
           "Gb/s RDMA per GPU, 'default 500W power limit' (a lower-TDP H100 than the 700W SXM). Sizes from "
           "torchtitan's llama3 ModelArgs (8B: dim 4096, 32 layers, 32 heads, 8 kv, ffn_dim_multiplier 1.3, "
           'multiple_of 1024 -> ffn 14336; 70B: dim 8192, 80 layers, 64 heads, 8 kv, 1.3, 4096 -> 28672; 405B: 16384, '
           '126, 128, 8, 1.2, 4096 -> 53248), vocab 128256, untied output projection; these match Llama 3 paper Table '
           '3.'},
 {'id': 'torchtitan-asynctp-llama31-70b-fsdp32-tp8-h100',
  'source': 'pytorch/torchtitan benchmarks/asyncTP_llama3_h100_2025-06_torchtitan.md',
  'source_kind': 'repo',
  'quote': '| None (bfloat16)   | 597.3 | 652.4 | 1.09 |',
  'model': {'family': 'llama',
            'layers': 80,
            'hidden': 8192,
            'heads': 64,
            'kv_heads': 8,
            'ffn': 28672,
            'vocab': 128256,
            'seq': 8192,
            'params_b': 70.0,
            'hf_config': 'LlamaConfig',
            'tied_embeddings': False},
  'hardware': 'h100',
  'gpus': 256,
  'mesh': {'tp': 8, 'pp': 1, 'dp': 32, 'cp': 1, 'ep': 1, 'vp': 1},
  'fsdp': 'fsdp',
  'sequence_parallel': True,
  'schedule': None,
  'micro_batch': 16,
  'global_batch': 512,
  'recompute': 'full',
  'precision': 'bf16',
  'torch_compile': True,
  'published': {'tflops_per_gpu': None, 'tokens_per_s_per_gpu': 597.3, 'mfu': None, 'step_s': None},
  'notes': "Vanilla TP tokens/sec column (2nd value). Header: 'Llama3 70b on 256 H100s with FSDP=32, TP=8, "
           "torch.compile, full AC,  local batch size 16'. Table heading says 'tokens/sec' (per-GPU, same metric as "
           'the other torchtitan files -- not restated here). global_batch = local batch * FSDP degree (derived). seq '
           "8192 from llama3_{8b,70b}.toml at the benchmarked commit 820504e. sequence_parallel=True: torchtitan's TP "
           'plan wraps the norms in SequenceParallel() (parallelize_llama.py). Float8 rows excluded. Grand Teton: 8 '
           "H100 per host on NVLink, 'Each H100 GPU is equipped with 96GB HBM2e with 2.4 TB/sec', 400 Gb/s RDMA per "
           "GPU, 'default 500W power limit' (a lower-TDP H100 than the 700W SXM). Sizes from torchtitan's llama3 "
           'ModelArgs (8B: dim 4096, 32 layers, 32 heads, 8 kv, ffn_dim_multiplier 1.3, multiple_of 1024 -> ffn 14336; '
           '70B: dim 8192, 80 layers, 64 heads, 8 kv, 1.3, 4096 -> 28672; 405B: 16384, 126, 128, 8, 1.2, 4096 -> '
           '53248), vocab 128256, untied output projection; these match Llama 3 paper Table 3.'},
 {'id': 'torchtitan-asynctp-llama31-70b-fsdp32-tp8-asynctp-h100',
  'source': 'pytorch/torchtitan benchmarks/asyncTP_llama3_h100_2025-06_torchtitan.md',
  'source_kind': 'repo',
  'quote': '| None (bfloat16)   | 597.3 | 652.4 | 1.09 |',
  'model': {'family': 'llama',
            'layers': 80,
            'hidden': 8192,
            'heads': 64,
            'kv_heads': 8,
            'ffn': 28672,
            'vocab': 128256,
            'seq': 8192,
            'params_b': 70.0,
            'hf_config': 'LlamaConfig',
            'tied_embeddings': False},
  'hardware': 'h100',
  'gpus': 256,
  'mesh': {'tp': 8, 'pp': 1, 'dp': 32, 'cp': 1, 'ep': 1, 'vp': 1},
  'fsdp': 'fsdp',
  'sequence_parallel': True,
  'schedule': None,
  'micro_batch': 16,
  'global_batch': 512,
  'recompute': 'full',
  'precision': 'bf16',
  'torch_compile': True,
  'published': {'tflops_per_gpu': None, 'tokens_per_s_per_gpu': 652.4, 'mfu': None, 'step_s': None},
  'notes': 'Async TP tokens/sec column (3rd value): TP all-gather/reduce-scatter overlapped with matmuls '
           '(micro-pipelined); a cost model without TP overlap should be compared with the vanilla row. Header: '
           "'Llama3 70b on 256 H100s with FSDP=32, TP=8, torch.compile, full AC,  local batch size 16'. Table heading "
           "says 'tokens/sec' (per-GPU, same metric as the other torchtitan files -- not restated here). global_batch "
           '= local batch * FSDP degree (derived). seq 8192 from llama3_{8b,70b}.toml at the benchmarked commit '
           "820504e. sequence_parallel=True: torchtitan's TP plan wraps the norms in SequenceParallel() "
           "(parallelize_llama.py). Float8 rows excluded. Grand Teton: 8 H100 per host on NVLink, 'Each H100 GPU is "
           "equipped with 96GB HBM2e with 2.4 TB/sec', 400 Gb/s RDMA per GPU, 'default 500W power limit' (a lower-TDP "
           "H100 than the 700W SXM). Sizes from torchtitan's llama3 ModelArgs (8B: dim 4096, 32 layers, 32 heads, 8 "
           'kv, ffn_dim_multiplier 1.3, multiple_of 1024 -> ffn 14336; 70B: dim 8192, 80 layers, 64 heads, 8 kv, 1.3, '
           '4096 -> 28672; 405B: 16384, 126, 128, 8, 1.2, 4096 -> 53248), vocab 128256, untied output projection; '
           'these match Llama 3 paper Table 3.'},
 {'id': 'torchtitan-asynctp-llama31-8b-fsdp8-tp8-h100',
  'source': 'pytorch/torchtitan benchmarks/asyncTP_llama3_h100_2025-06_torchtitan.md',
  'source_kind': 'repo',
  'quote': '| None (bfloat16)   | 4378   | 4809.4 | 1.10 |',
  'model': {'family': 'llama',
            'layers': 32,
            'hidden': 4096,
            'heads': 32,
            'kv_heads': 8,
            'ffn': 14336,
            'vocab': 128256,
            'seq': 8192,
            'params_b': 8.0,
            'hf_config': 'LlamaConfig',
            'tied_embeddings': False},
  'hardware': 'h100',
  'gpus': 64,
  'mesh': {'tp': 8, 'pp': 1, 'dp': 8, 'cp': 1, 'ep': 1, 'vp': 1},
  'fsdp': 'fsdp',
  'sequence_parallel': True,
  'schedule': None,
  'micro_batch': 12,
  'global_batch': 96,
  'recompute': 'selective',
  'precision': 'bf16',
  'torch_compile': True,
  'published': {'tflops_per_gpu': None, 'tokens_per_s_per_gpu': 4378.0, 'mfu': None, 'step_s': None},
  'notes': "Vanilla TP tokens/sec column (2nd value). Header: 'Llama3 8b on 64 H100s with FSDP=8, TP=8, torch.compile, "
           "per op SAC, local batch size 12'. Table heading says 'tokens/sec' (per-GPU, same metric as the other "
           'torchtitan files -- not restated here). global_batch = local batch * FSDP degree (derived). seq 8192 from '
           "llama3_{8b,70b}.toml at the benchmarked commit 820504e. sequence_parallel=True: torchtitan's TP plan wraps "
           'the norms in SequenceParallel() (parallelize_llama.py). Float8 rows excluded. Grand Teton: 8 H100 per host '
           "on NVLink, 'Each H100 GPU is equipped with 96GB HBM2e with 2.4 TB/sec', 400 Gb/s RDMA per GPU, 'default "
           "500W power limit' (a lower-TDP H100 than the 700W SXM). Sizes from torchtitan's llama3 ModelArgs (8B: dim "
           '4096, 32 layers, 32 heads, 8 kv, ffn_dim_multiplier 1.3, multiple_of 1024 -> ffn 14336; 70B: dim 8192, 80 '
           'layers, 64 heads, 8 kv, 1.3, 4096 -> 28672; 405B: 16384, 126, 128, 8, 1.2, 4096 -> 53248), vocab 128256, '
           'untied output projection; these match Llama 3 paper Table 3.'},
 {'id': 'torchtitan-asynctp-llama31-8b-fsdp8-tp8-asynctp-h100',
  'source': 'pytorch/torchtitan benchmarks/asyncTP_llama3_h100_2025-06_torchtitan.md',
  'source_kind': 'repo',
  'quote': '| None (bfloat16)   | 4378   | 4809.4 | 1.10 |',
  'model': {'family': 'llama',
            'layers': 32,
            'hidden': 4096,
            'heads': 32,
            'kv_heads': 8,
            'ffn': 14336,
            'vocab': 128256,
            'seq': 8192,
            'params_b': 8.0,
            'hf_config': 'LlamaConfig',
            'tied_embeddings': False},
  'hardware': 'h100',
  'gpus': 64,
  'mesh': {'tp': 8, 'pp': 1, 'dp': 8, 'cp': 1, 'ep': 1, 'vp': 1},
  'fsdp': 'fsdp',
  'sequence_parallel': True,
  'schedule': None,
  'micro_batch': 12,
  'global_batch': 96,
  'recompute': 'selective',
  'precision': 'bf16',
  'torch_compile': True,
  'published': {'tflops_per_gpu': None, 'tokens_per_s_per_gpu': 4809.4, 'mfu': None, 'step_s': None},
  'notes': 'Async TP tokens/sec column (3rd value): TP all-gather/reduce-scatter overlapped with matmuls '
           '(micro-pipelined); a cost model without TP overlap should be compared with the vanilla row. Header: '
           "'Llama3 8b on 64 H100s with FSDP=8, TP=8, torch.compile, per op SAC, local batch size 12'. Table heading "
           "says 'tokens/sec' (per-GPU, same metric as the other torchtitan files -- not restated here). global_batch "
           '= local batch * FSDP degree (derived). seq 8192 from llama3_{8b,70b}.toml at the benchmarked commit '
           "820504e. sequence_parallel=True: torchtitan's TP plan wraps the norms in SequenceParallel() "
           "(parallelize_llama.py). Float8 rows excluded. Grand Teton: 8 H100 per host on NVLink, 'Each H100 GPU is "
           "equipped with 96GB HBM2e with 2.4 TB/sec', 400 Gb/s RDMA per GPU, 'default 500W power limit' (a lower-TDP "
           "H100 than the 700W SXM). Sizes from torchtitan's llama3 ModelArgs (8B: dim 4096, 32 layers, 32 heads, 8 "
           'kv, ffn_dim_multiplier 1.3, multiple_of 1024 -> ffn 14336; 70B: dim 8192, 80 layers, 64 heads, 8 kv, 1.3, '
           '4096 -> 28672; 405B: 16384, 126, 128, 8, 1.2, 4096 -> 53248), vocab 128256, untied output projection; '
           'these match Llama 3 paper Table 3.'},
 {'id': 'torchtitan-2404-llama3-8b-fsdp64-sac-layer-a100',
  'source': "pytorch/torchtitan docs/performance.md @1ea476e9f (2024-04-24), 'Llama 3 performance numbers'",
  'source_kind': 'repo',
  'quote': '| 8B | 1 | selective layer | 2904 | 56.8% |',
  'model': {'family': 'llama',
            'layers': 32,
            'hidden': 4096,
            'heads': 32,
            'kv_heads': 8,
            'ffn': 14336,
            'vocab': 128256,
            'seq': 8192,
            'params_b': 8.0,
            'hf_config': 'LlamaConfig',
            'tied_embeddings': False},
  'hardware': 'a100-80gb',
  'gpus': 64,
  'mesh': {'tp': 1, 'pp': 1, 'dp': 64, 'cp': 1, 'ep': 1, 'vp': 1},
  'fsdp': 'fsdp',
  'sequence_parallel': False,
  'schedule': None,
  'micro_batch': 1,
  'global_batch': 64,
  'recompute': 'selective',
  'precision': 'bf16',
  'torch_compile': False,
  'published': {'tflops_per_gpu': None, 'tokens_per_s_per_gpu': 2904.0, 'mfu': 0.568, 'step_s': None},
  'notes': 'Layer-granular selective AC (torchtitan selective_ac_option = an integer: checkpoint every Nth block). '
           "'Llama 3 models with FSDP2 on 64 A100 (80GB) GPUs'; 'local batch size 1 (global batch size = local batch "
           "size 1 * number of FSDP ranks 64 = 64)'; infra metrics are for FSDP2 1D parallelism. seq 8192 and "
           'compile=false from train_configs/llama3_{8b,70b}.toml at 1ea476e9f. Llama 3 (not 3.1) 8B/70B: same shapes. '
           'Interconnect not described. MFU convention (torchtitan train.py/utils.py at that time): flop_per_token = '
           '6*N + 12*l*h*q*t with N = all parameters (embeddings included), q = head dim, t = seq (full, non-causal '
           'attention; no recompute); peak 312e12 for A100, 989e12 for H100 SXM. WPS = tokens/s per GPU. Sizes from '
           "torchtitan's llama3 ModelArgs (8B: dim 4096, 32 layers, 32 heads, 8 kv, ffn_dim_multiplier 1.3, "
           'multiple_of 1024 -> ffn 14336; 70B: dim 8192, 80 layers, 64 heads, 8 kv, 1.3, 4096 -> 28672; 405B: 16384, '
           '126, 128, 8, 1.2, 4096 -> 53248), vocab 128256, untied output projection; these match Llama 3 paper Table '
           '3.'},
 {'id': 'torchtitan-2404-llama3-8b-fsdp64-sac-op-a100',
  'source': "pytorch/torchtitan docs/performance.md @1ea476e9f (2024-04-24), 'Llama 3 performance numbers'",
  'source_kind': 'repo',
  'quote': '| 8B | 1 | selective op | 2973 | 58.2% |',
  'model': {'family': 'llama',
            'layers': 32,
            'hidden': 4096,
            'heads': 32,
            'kv_heads': 8,
            'ffn': 14336,
            'vocab': 128256,
            'seq': 8192,
            'params_b': 8.0,
            'hf_config': 'LlamaConfig',
            'tied_embeddings': False},
  'hardware': 'a100-80gb',
  'gpus': 64,
  'mesh': {'tp': 1, 'pp': 1, 'dp': 64, 'cp': 1, 'ep': 1, 'vp': 1},
  'fsdp': 'fsdp',
  'sequence_parallel': False,
  'schedule': None,
  'micro_batch': 1,
  'global_batch': 64,
  'recompute': 'selective',
  'precision': 'bf16',
  'torch_compile': False,
  'published': {'tflops_per_gpu': None, 'tokens_per_s_per_gpu': 2973.0, 'mfu': 0.582, 'step_s': None},
  'notes': "Op-level selective AC. 'Llama 3 models with FSDP2 on 64 A100 (80GB) GPUs'; 'local batch size 1 (global "
           "batch size = local batch size 1 * number of FSDP ranks 64 = 64)'; infra metrics are for FSDP2 1D "
           'parallelism. seq 8192 and compile=false from train_configs/llama3_{8b,70b}.toml at 1ea476e9f. Llama 3 (not '
           '3.1) 8B/70B: same shapes. Interconnect not described. MFU convention (torchtitan train.py/utils.py at that '
           'time): flop_per_token = 6*N + 12*l*h*q*t with N = all parameters (embeddings included), q = head dim, t = '
           'seq (full, non-causal attention; no recompute); peak 312e12 for A100, 989e12 for H100 SXM. WPS = tokens/s '
           "per GPU. Sizes from torchtitan's llama3 ModelArgs (8B: dim 4096, 32 layers, 32 heads, 8 kv, "
           'ffn_dim_multiplier 1.3, multiple_of 1024 -> ffn 14336; 70B: dim 8192, 80 layers, 64 heads, 8 kv, 1.3, 4096 '
           '-> 28672; 405B: 16384, 126, 128, 8, 1.2, 4096 -> 53248), vocab 128256, untied output projection; these '
           'match Llama 3 paper Table 3.'},
 {'id': 'torchtitan-2404-llama3-70b-fsdp64-full-a100',
  'source': "pytorch/torchtitan docs/performance.md @1ea476e9f (2024-04-24), 'Llama 3 performance numbers'",
  'source_kind': 'repo',
  'quote': '| 70B | 1 | full | 331 | 51.7% |',
  'model': {'family': 'llama',
            'layers': 80,
            'hidden': 8192,
            'heads': 64,
            'kv_heads': 8,
            'ffn': 28672,
            'vocab': 128256,
            'seq': 8192,
            'params_b': 70.0,
            'hf_config': 'LlamaConfig',
            'tied_embeddings': False},
  'hardware': 'a100-80gb',
  'gpus': 64,
  'mesh': {'tp': 1, 'pp': 1, 'dp': 64, 'cp': 1, 'ep': 1, 'vp': 1},
  'fsdp': 'fsdp',
  'sequence_parallel': False,
  'schedule': None,
  'micro_batch': 1,
  'global_batch': 64,
  'recompute': 'full',
  'precision': 'bf16',
  'torch_compile': False,
  'published': {'tflops_per_gpu': None, 'tokens_per_s_per_gpu': 331.0, 'mfu': 0.517, 'step_s': None},
  'notes': "'Llama 3 models with FSDP2 on 64 A100 (80GB) GPUs'; 'local batch size 1 (global batch size = local batch "
           "size 1 * number of FSDP ranks 64 = 64)'; infra metrics are for FSDP2 1D parallelism. seq 8192 and "
           'compile=false from train_configs/llama3_{8b,70b}.toml at 1ea476e9f. Llama 3 (not 3.1) 8B/70B: same shapes. '
           'Interconnect not described. MFU convention (torchtitan train.py/utils.py at that time): flop_per_token = '
           '6*N + 12*l*h*q*t with N = all parameters (embeddings included), q = head dim, t = seq (full, non-causal '
           'attention; no recompute); peak 312e12 for A100, 989e12 for H100 SXM. WPS = tokens/s per GPU. Sizes from '
           "torchtitan's llama3 ModelArgs (8B: dim 4096, 32 layers, 32 heads, 8 kv, ffn_dim_multiplier 1.3, "
           'multiple_of 1024 -> ffn 14336; 70B: dim 8192, 80 layers, 64 heads, 8 kv, 1.3, 4096 -> 28672; 405B: 16384, '
           '126, 128, 8, 1.2, 4096 -> 53248), vocab 128256, untied output projection; these match Llama 3 paper Table '
           '3.'},
 {'id': 'torchtitan-2404-llama2-13b-fsdp64-noac-a100',
  'source': "pytorch/torchtitan docs/performance.md @395a52627 (2024-04-18) / 1ea476e9f 'Llama 2 performance numbers'",
  'source_kind': 'repo',
  'quote': '| 13B | 2 | no | 2162 | 61.1%\t|',
  'model': {'family': 'llama',
            'layers': 40,
            'hidden': 5120,
            'heads': 40,
            'kv_heads': None,
            'ffn': 13824,
            'vocab': 32000,
            'seq': 4096,
            'params_b': 13.0,
            'hf_config': 'LlamaConfig',
            'tied_embeddings': False},
  'hardware': 'a100-80gb',
  'gpus': 64,
  'mesh': {'tp': 1, 'pp': 1, 'dp': 64, 'cp': 1, 'ep': 1, 'vp': 1},
  'fsdp': 'fsdp',
  'sequence_parallel': False,
  'schedule': None,
  'micro_batch': 2,
  'global_batch': 128,
  'recompute': 'none',
  'precision': 'bf16',
  'torch_compile': False,
  'published': {'tflops_per_gpu': None, 'tokens_per_s_per_gpu': 2162.0, 'mfu': 0.611, 'step_s': None},
  'notes': "'We mostly use local batch size 2 (global batch size = local batch size 2 * number of FSDP ranks 64 = "
           "128)'; FSDP2 1D on 64 A100 80GB. The 70B row at 395a52627 also lists a local-batch-1 selective-op row (355 "
           'WPS, 50.8%). compile=false in the tomls of that date. Llama 2 sizes from '
           'torchtitan/models/llama/__init__.py llama2_configs at 1ea476e9f (13B: dim 5120, 40 layers, 40 heads, '
           'default multiple_of 256 -> ffn int(2*4*5120/3)=13653 rounded up to 13824; 70B: dim 8192, 80 layers, 64 '
           'heads, 8 kv, ffn_dim_multiplier 1.3, multiple_of 4096 -> 28672). vocab 32000 = Llama 2 tokenizer '
           '(transformers LlamaConfig default vocab_size 32000); untied. seq 4096 from '
           'train_configs/llama2_{13b,70b}.toml. MFU convention (torchtitan train.py/utils.py at that time): '
           'flop_per_token = 6*N + 12*l*h*q*t with N = all parameters (embeddings included), q = head dim, t = seq '
           '(full, non-causal attention; no recompute); peak 312e12 for A100, 989e12 for H100 SXM. WPS = tokens/s per '
           'GPU.'},
 {'id': 'torchtitan-2404-llama2-13b-fsdp64-sac-op-a100',
  'source': "pytorch/torchtitan docs/performance.md @395a52627 (2024-04-18) / 1ea476e9f 'Llama 2 performance numbers'",
  'source_kind': 'repo',
  'quote': '| 13B | 2 | selective op | 1904 | 53.8% |',
  'model': {'family': 'llama',
            'layers': 40,
            'hidden': 5120,
            'heads': 40,
            'kv_heads': None,
            'ffn': 13824,
            'vocab': 32000,
            'seq': 4096,
            'params_b': 13.0,
            'hf_config': 'LlamaConfig',
            'tied_embeddings': False},
  'hardware': 'a100-80gb',
  'gpus': 64,
  'mesh': {'tp': 1, 'pp': 1, 'dp': 64, 'cp': 1, 'ep': 1, 'vp': 1},
  'fsdp': 'fsdp',
  'sequence_parallel': False,
  'schedule': None,
  'micro_batch': 2,
  'global_batch': 128,
  'recompute': 'selective',
  'precision': 'bf16',
  'torch_compile': False,
  'published': {'tflops_per_gpu': None, 'tokens_per_s_per_gpu': 1904.0, 'mfu': 0.538, 'step_s': None},
  'notes': "'We mostly use local batch size 2 (global batch size = local batch size 2 * number of FSDP ranks 64 = "
           "128)'; FSDP2 1D on 64 A100 80GB. The 70B row at 395a52627 also lists a local-batch-1 selective-op row (355 "
           'WPS, 50.8%). compile=false in the tomls of that date. Llama 2 sizes from '
           'torchtitan/models/llama/__init__.py llama2_configs at 1ea476e9f (13B: dim 5120, 40 layers, 40 heads, '
           'default multiple_of 256 -> ffn int(2*4*5120/3)=13653 rounded up to 13824; 70B: dim 8192, 80 layers, 64 '
           'heads, 8 kv, ffn_dim_multiplier 1.3, multiple_of 4096 -> 28672). vocab 32000 = Llama 2 tokenizer '
           '(transformers LlamaConfig default vocab_size 32000); untied. seq 4096 from '
           'train_configs/llama2_{13b,70b}.toml. MFU convention (torchtitan train.py/utils.py at that time): '
           'flop_per_token = 6*N + 12*l*h*q*t with N = all parameters (embeddings included), q = head dim, t = seq '
           '(full, non-causal attention; no recompute); peak 312e12 for A100, 989e12 for H100 SXM. WPS = tokens/s per '
           'GPU.'},
 {'id': 'torchtitan-2404-llama2-70b-fsdp64-full-a100',
  'source': "pytorch/torchtitan docs/performance.md @395a52627 (2024-04-18) / 1ea476e9f 'Llama 2 performance numbers'",
  'source_kind': 'repo',
  'quote': '| 70B | 2 | full | 353 | 50.5% |',
  'model': {'family': 'llama',
            'layers': 80,
            'hidden': 8192,
            'heads': 64,
            'kv_heads': 8,
            'ffn': 28672,
            'vocab': 32000,
            'seq': 4096,
            'params_b': 70.0,
            'hf_config': 'LlamaConfig',
            'tied_embeddings': False},
  'hardware': 'a100-80gb',
  'gpus': 64,
  'mesh': {'tp': 1, 'pp': 1, 'dp': 64, 'cp': 1, 'ep': 1, 'vp': 1},
  'fsdp': 'fsdp',
  'sequence_parallel': False,
  'schedule': None,
  'micro_batch': 2,
  'global_batch': 128,
  'recompute': 'full',
  'precision': 'bf16',
  'torch_compile': False,
  'published': {'tflops_per_gpu': None, 'tokens_per_s_per_gpu': 353.0, 'mfu': 0.505, 'step_s': None},
  'notes': "'We mostly use local batch size 2 (global batch size = local batch size 2 * number of FSDP ranks 64 = "
           "128)'; FSDP2 1D on 64 A100 80GB. The 70B row at 395a52627 also lists a local-batch-1 selective-op row (355 "
           'WPS, 50.8%). compile=false in the tomls of that date. Llama 2 sizes from '
           'torchtitan/models/llama/__init__.py llama2_configs at 1ea476e9f (13B: dim 5120, 40 layers, 40 heads, '
           'default multiple_of 256 -> ffn int(2*4*5120/3)=13653 rounded up to 13824; 70B: dim 8192, 80 layers, 64 '
           'heads, 8 kv, ffn_dim_multiplier 1.3, multiple_of 4096 -> 28672). vocab 32000 = Llama 2 tokenizer '
           '(transformers LlamaConfig default vocab_size 32000); untied. seq 4096 from '
           'train_configs/llama2_{13b,70b}.toml. MFU convention (torchtitan train.py/utils.py at that time): '
           'flop_per_token = 6*N + 12*l*h*q*t with N = all parameters (embeddings included), q = head dim, t = seq '
           '(full, non-causal attention; no recompute); peak 312e12 for A100, 989e12 for H100 SXM. WPS = tokens/s per '
           'GPU.'},
 {'id': 'torchtitan-2408-llama31-405b-fsdp16-tp8-h100',
  'source': "pytorch/torchtitan docs/performance.md @4d88a8a44 (2024-12-03; number fixed in 3faaa1a0d), 'Llama 3.1 "
            "performance numbers'",
  'source_kind': 'repo',
  'quote': '| 405B | 2 | full | 109 | 29.0%[^1] | None',
  'model': {'family': 'llama',
            'layers': 126,
            'hidden': 16384,
            'heads': 128,
            'kv_heads': 8,
            'ffn': 53248,
            'vocab': 128256,
            'seq': 8192,
            'params_b': 405.0,
            'hf_config': 'LlamaConfig',
            'tied_embeddings': False},
  'hardware': 'h100',
  'gpus': 128,
  'mesh': {'tp': 8, 'pp': 1, 'dp': 16, 'cp': 1, 'ep': 1, 'vp': 1},
  'fsdp': 'fsdp',
  'sequence_parallel': True,
  'schedule': None,
  'micro_batch': 2,
  'global_batch': 32,
  'recompute': 'full',
  'precision': 'bf16',
  'torch_compile': None,
  'published': {'tflops_per_gpu': None, 'tokens_per_s_per_gpu': 109.0, 'mfu': 0.29, 'step_s': None},
  'notes': "'we run on 128 H100 GPUs'; 2D (FSDP2 + TP); 'local batch size 2 (global batch size = local batch size 2 * "
           "number of FSDP ranks 16 = 32)' -> TP 8 (derived, = tensor_parallel_degree in "
           "train_configs/llama3_405b.toml at 3faaa1a0d); seq 8192 from that toml. Row 'Optimizations: None' (the toml "
           'of that commit sets compile = true, so torch.compile use for this row is unclear -> None). Footnote: '
           "'HBM2e based lower TDP SXM H100(95GB) ... MFU number is lower than actual MFU because we use the peak "
           "number of SXM directly'. Float8 rows excluded. MFU convention (torchtitan train.py/utils.py at that time): "
           'flop_per_token = 6*N + 12*l*h*q*t with N = all parameters (embeddings included), q = head dim, t = seq '
           '(full, non-causal attention; no recompute); peak 312e12 for A100, 989e12 for H100 SXM. WPS = tokens/s per '
           "GPU. Sizes from torchtitan's llama3 ModelArgs (8B: dim 4096, 32 layers, 32 heads, 8 kv, ffn_dim_multiplier "
           '1.3, multiple_of 1024 -> ffn 14336; 70B: dim 8192, 80 layers, 64 heads, 8 kv, 1.3, 4096 -> 28672; 405B: '
           '16384, 126, 128, 8, 1.2, 4096 -> 53248), vocab 128256, untied output projection; these match Llama 3 paper '
           'Table 3.'},
 {'id': 'mpt-70b-s2048-512gpu-h100',
  'source': 'mosaicml/llm-foundry scripts/train/benchmarking/README.md, H100 80GB BF16 (Large Scale, >= 128 GPUs)',
  'source_kind': 'repo',
  'quote': '|  70b | 2048 | 512 | h100_80gb | 41.25 | 55.0 | 408 | 8 | 1 | 4096 | 251 | 515636 | 1007 | 8388608 | '
           'amp_bf16 | DEFAULT | FULL_SHARD | True | False | 64862437376 |',
  'model': {'family': 'mpt',
            'layers': 80,
            'hidden': 8192,
            'heads': 64,
            'kv_heads': None,
            'ffn': 32768,
            'vocab': 50368,
            'seq': 2048,
            'params_b': 64.862,
            'hf_config': 'MptConfig',
            'tied_embeddings': True},
  'hardware': 'h100',
  'gpus': 512,
  'mesh': {'tp': 1, 'pp': 1, 'dp': 512, 'cp': 1, 'ep': 1, 'vp': 1},
  'fsdp': 'fsdp',
  'sequence_parallel': False,
  'schedule': None,
  'micro_batch': 8,
  'global_batch': 4096,
  'recompute': 'full',
  'precision': 'bf16',
  'torch_compile': False,
  'published': {'tflops_per_gpu': 408.0, 'tokens_per_s_per_gpu': 1007.0, 'mfu': 0.4125, 'step_s': None},
  'notes': "section 'H100 80GB BF16 (Large Scale, >= 128 GPUs)' (interconnect not stated). PyTorch FSDP FULL_SHARD "
           "(FULL_SHARD = ZeRO-3-like, SHARD_GRAD_OP = ZeRO-2-like), precision amp_bf16 / MP mode DEFAULT ('amp_bf16 "
           "DEFAULT' = autocast bf16 with fp32 master weights; 'bf16 PURE' = FSDP mixed precision with "
           'params/reduce/buffers in bf16); GradAccum 1; global_batch = MicroBatchSize*GradAccum*gpus = 4096 '
           'sequences; HFU 55.0%; samples/s 251, tokens/s 515636; NumParams 64862437376. Activation checkpointing True '
           "(FSDP per-block checkpointing -> 'full'). Columns: MFU | HFU | Model TFLOP | MicroBatchSize | GradAccum | "
           'GlobalBatchSize | Throughput (S/s) | (T/s) | (T/s/GPU) | ... | Precision | MP Mode | Sharding Strategy | '
           'Activation Checkpointing | ... | NumParams. Convention (README + collect_results.py): flops_per_seq = '
           '2*n_params*seq, attn_flops_per_seq = n_layers*2*2*d_model*seq^2 (full, non-causal); Model TFLOP = '
           "(3*flops_per_seq + 3*attn_flops_per_seq) * samples/s / gpus; MFU against composer's GPU_AVAILABLE_FLOPS "
           'for the precision (h100-sxm / a100; MFU/Model-TFLOP ratios imply ~989 and ~312 TFLOP/s); HFU uses 4x '
           'instead of 3x when activation checkpointing is on. FLOPs exclude norms/activations/residuals. n_params '
           'includes the learned position embedding (NumParams varies with seq). Tables predate the torch-2.0 update '
           "('TODO: Update tables with torch 2.0') -> torch_compile False. MPT architecture from "
           'scripts/train/yamls/pretrain/mpt-<size>.yaml at the fetched HEAD (d_model, n_heads, n_layers, '
           'expansion_ratio 4, vocab 50368, flash attention); MPTConfig defaults learned_pos_emb=True, '
           'tie_word_embeddings=True; GELU MLP (no gate). The yamls may have changed since the tables were produced '
           '(the 3b/1b yamls note heads modified for FlashAttention head dim 128); NumParams in the row is the '
           'authoritative size.'},
 {'id': 'mpt-70b-s2048-128gpu-h100',
  'source': 'mosaicml/llm-foundry scripts/train/benchmarking/README.md, H100 80GB BF16 (Large Scale, >= 128 GPUs)',
  'source_kind': 'repo',
  'quote': '|  70b | 2048 | 128 | h100_80gb | 43.36 | 57.81 | 428 | 8 | 1 | 1024 | 66 | 135490 | 1058 | 2097152 | '
           'amp_bf16 | DEFAULT | FULL_SHARD | True | False | 64862437376 |',
  'model': {'family': 'mpt',
            'layers': 80,
            'hidden': 8192,
            'heads': 64,
            'kv_heads': None,
            'ffn': 32768,
            'vocab': 50368,
            'seq': 2048,
            'params_b': 64.862,
            'hf_config': 'MptConfig',
            'tied_embeddings': True},
  'hardware': 'h100',
  'gpus': 128,
  'mesh': {'tp': 1, 'pp': 1, 'dp': 128, 'cp': 1, 'ep': 1, 'vp': 1},
  'fsdp': 'fsdp',
  'sequence_parallel': False,
  'schedule': None,
  'micro_batch': 8,
  'global_batch': 1024,
  'recompute': 'full',
  'precision': 'bf16',
  'torch_compile': False,
  'published': {'tflops_per_gpu': 428.0, 'tokens_per_s_per_gpu': 1058.0, 'mfu': 0.4336, 'step_s': None},
  'notes': "section 'H100 80GB BF16 (Large Scale, >= 128 GPUs)' (interconnect not stated). PyTorch FSDP FULL_SHARD "
           "(FULL_SHARD = ZeRO-3-like, SHARD_GRAD_OP = ZeRO-2-like), precision amp_bf16 / MP mode DEFAULT ('amp_bf16 "
           "DEFAULT' = autocast bf16 with fp32 master weights; 'bf16 PURE' = FSDP mixed precision with "
           'params/reduce/buffers in bf16); GradAccum 1; global_batch = MicroBatchSize*GradAccum*gpus = 1024 '
           'sequences; HFU 57.81%; samples/s 66, tokens/s 135490; NumParams 64862437376. Activation checkpointing True '
           "(FSDP per-block checkpointing -> 'full'). Columns: MFU | HFU | Model TFLOP | MicroBatchSize | GradAccum | "
           'GlobalBatchSize | Throughput (S/s) | (T/s) | (T/s/GPU) | ... | Precision | MP Mode | Sharding Strategy | '
           'Activation Checkpointing | ... | NumParams. Convention (README + collect_results.py): flops_per_seq = '
           '2*n_params*seq, attn_flops_per_seq = n_layers*2*2*d_model*seq^2 (full, non-causal); Model TFLOP = '
           "(3*flops_per_seq + 3*attn_flops_per_seq) * samples/s / gpus; MFU against composer's GPU_AVAILABLE_FLOPS "
           'for the precision (h100-sxm / a100; MFU/Model-TFLOP ratios imply ~989 and ~312 TFLOP/s); HFU uses 4x '
           'instead of 3x when activation checkpointing is on. FLOPs exclude norms/activations/residuals. n_params '
           'includes the learned position embedding (NumParams varies with seq). Tables predate the torch-2.0 update '
           "('TODO: Update tables with torch 2.0') -> torch_compile False. MPT architecture from "
           'scripts/train/yamls/pretrain/mpt-<size>.yaml at the fetched HEAD (d_model, n_heads, n_layers, '
           'expansion_ratio 4, vocab 50368, flash attention); MPTConfig defaults learned_pos_emb=True, '
           'tie_word_embeddings=True; GELU MLP (no gate). The yamls may have changed since the tables were produced '
           '(the 3b/1b yamls note heads modified for FlashAttention head dim 128); NumParams in the row is the '
           'authoritative size.'},
 {'id': 'mpt-30b-s2048-512gpu-h100',
  'source': 'mosaicml/llm-foundry scripts/train/benchmarking/README.md, H100 80GB BF16 (Large Scale, >= 128 GPUs)',
  'source_kind': 'repo',
  'quote': '|  30b | 2048 | 512 | h100_80gb | 40.27 | 53.69 | 398 | 8 | 1 | 4096 | 528 | 1083366 | 2115 | 8388608 | '
           'amp_bf16 | DEFAULT | FULL_SHARD | True | False | 29975214080 |',
  'model': {'family': 'mpt',
            'layers': 48,
            'hidden': 7168,
            'heads': 56,
            'kv_heads': None,
            'ffn': 28672,
            'vocab': 50368,
            'seq': 2048,
            'params_b': 29.975,
            'hf_config': 'MptConfig',
            'tied_embeddings': True},
  'hardware': 'h100',
  'gpus': 512,
  'mesh': {'tp': 1, 'pp': 1, 'dp': 512, 'cp': 1, 'ep': 1, 'vp': 1},
  'fsdp': 'fsdp',
  'sequence_parallel': False,
  'schedule': None,
  'micro_batch': 8,
  'global_batch': 4096,
  'recompute': 'full',
  'precision': 'bf16',
  'torch_compile': False,
  'published': {'tflops_per_gpu': 398.0, 'tokens_per_s_per_gpu': 2115.0, 'mfu': 0.4027, 'step_s': None},
  'notes': "section 'H100 80GB BF16 (Large Scale, >= 128 GPUs)' (interconnect not stated). PyTorch FSDP FULL_SHARD "
           "(FULL_SHARD = ZeRO-3-like, SHARD_GRAD_OP = ZeRO-2-like), precision amp_bf16 / MP mode DEFAULT ('amp_bf16 "
           "DEFAULT' = autocast bf16 with fp32 master weights; 'bf16 PURE' = FSDP mixed precision with "
           'params/reduce/buffers in bf16); GradAccum 1; global_batch = MicroBatchSize*GradAccum*gpus = 4096 '
           'sequences; HFU 53.69%; samples/s 528, tokens/s 1083366; NumParams 29975214080. Activation checkpointing '
           "True (FSDP per-block checkpointing -> 'full'). Columns: MFU | HFU | Model TFLOP | MicroBatchSize | "
           'GradAccum | GlobalBatchSize | Throughput (S/s) | (T/s) | (T/s/GPU) | ... | Precision | MP Mode | Sharding '
           'Strategy | Activation Checkpointing | ... | NumParams. Convention (README + collect_results.py): '
           'flops_per_seq = 2*n_params*seq, attn_flops_per_seq = n_layers*2*2*d_model*seq^2 (full, non-causal); Model '
           "TFLOP = (3*flops_per_seq + 3*attn_flops_per_seq) * samples/s / gpus; MFU against composer's "
           'GPU_AVAILABLE_FLOPS for the precision (h100-sxm / a100; MFU/Model-TFLOP ratios imply ~989 and ~312 '
           'TFLOP/s); HFU uses 4x instead of 3x when activation checkpointing is on. FLOPs exclude '
           'norms/activations/residuals. n_params includes the learned position embedding (NumParams varies with seq). '
           "Tables predate the torch-2.0 update ('TODO: Update tables with torch 2.0') -> torch_compile False. MPT "
           'architecture from scripts/train/yamls/pretrain/mpt-<size>.yaml at the fetched HEAD (d_model, n_heads, '
           'n_layers, expansion_ratio 4, vocab 50368, flash attention); MPTConfig defaults learned_pos_emb=True, '
           'tie_word_embeddings=True; GELU MLP (no gate). The yamls may have changed since the tables were produced '
           '(the 3b/1b yamls note heads modified for FlashAttention head dim 128); NumParams in the row is the '
           'authoritative size.'},
 {'id': 'mpt-30b-s2048-128gpu-h100',
  'source': 'mosaicml/llm-foundry scripts/train/benchmarking/README.md, H100 80GB BF16 (Large Scale, >= 128 GPUs)',
  'source_kind': 'repo',
  'quote': '|  30b | 2048 | 128 | h100_80gb | 41.85 | 55.8 | 414 | 8 | 1 | 1024 | 137 | 281491 | 2199 | 2097152 | '
           'amp_bf16 | DEFAULT | FULL_SHARD | True | False | 29975214080 |',
  'model': {'family': 'mpt',
            'layers': 48,
            'hidden': 7168,
            'heads': 56,
            'kv_heads': None,
            'ffn': 28672,
            'vocab': 50368,
            'seq': 2048,
            'params_b': 29.975,
            'hf_config': 'MptConfig',
            'tied_embeddings': True},
  'hardware': 'h100',
  'gpus': 128,
  'mesh': {'tp': 1, 'pp': 1, 'dp': 128, 'cp': 1, 'ep': 1, 'vp': 1},
  'fsdp': 'fsdp',
  'sequence_parallel': False,
  'schedule': None,
  'micro_batch': 8,
  'global_batch': 1024,
  'recompute': 'full',
  'precision': 'bf16',
  'torch_compile': False,
  'published': {'tflops_per_gpu': 414.0, 'tokens_per_s_per_gpu': 2199.0, 'mfu': 0.4185, 'step_s': None},
  'notes': "section 'H100 80GB BF16 (Large Scale, >= 128 GPUs)' (interconnect not stated). PyTorch FSDP FULL_SHARD "
           "(FULL_SHARD = ZeRO-3-like, SHARD_GRAD_OP = ZeRO-2-like), precision amp_bf16 / MP mode DEFAULT ('amp_bf16 "
           "DEFAULT' = autocast bf16 with fp32 master weights; 'bf16 PURE' = FSDP mixed precision with "
           'params/reduce/buffers in bf16); GradAccum 1; global_batch = MicroBatchSize*GradAccum*gpus = 1024 '
           'sequences; HFU 55.8%; samples/s 137, tokens/s 281491; NumParams 29975214080. Activation checkpointing True '
           "(FSDP per-block checkpointing -> 'full'). Columns: MFU | HFU | Model TFLOP | MicroBatchSize | GradAccum | "
           'GlobalBatchSize | Throughput (S/s) | (T/s) | (T/s/GPU) | ... | Precision | MP Mode | Sharding Strategy | '
           'Activation Checkpointing | ... | NumParams. Convention (README + collect_results.py): flops_per_seq = '
           '2*n_params*seq, attn_flops_per_seq = n_layers*2*2*d_model*seq^2 (full, non-causal); Model TFLOP = '
           "(3*flops_per_seq + 3*attn_flops_per_seq) * samples/s / gpus; MFU against composer's GPU_AVAILABLE_FLOPS "
           'for the precision (h100-sxm / a100; MFU/Model-TFLOP ratios imply ~989 and ~312 TFLOP/s); HFU uses 4x '
           'instead of 3x when activation checkpointing is on. FLOPs exclude norms/activations/residuals. n_params '
           'includes the learned position embedding (NumParams varies with seq). Tables predate the torch-2.0 update '
           "('TODO: Update tables with torch 2.0') -> torch_compile False. MPT architecture from "
           'scripts/train/yamls/pretrain/mpt-<size>.yaml at the fetched HEAD (d_model, n_heads, n_layers, '
           'expansion_ratio 4, vocab 50368, flash attention); MPTConfig defaults learned_pos_emb=True, '
           'tie_word_embeddings=True; GELU MLP (no gate). The yamls may have changed since the tables were produced '
           '(the 3b/1b yamls note heads modified for FlashAttention head dim 128); NumParams in the row is the '
           'authoritative size.'},
 {'id': 'mpt-13b-s2048-512gpu-h100',
  'source': 'mosaicml/llm-foundry scripts/train/benchmarking/README.md, H100 80GB BF16 (Large Scale, >= 128 GPUs)',
  'source_kind': 'repo',
  'quote': '|  13b | 2048 | 512 | h100_80gb | 41.12 | 54.83 | 406 | 16 | 1 | 8192 | 1238 | 2535811 | 4952 | 16777216 | '
           'amp_bf16 | DEFAULT | FULL_SHARD | True | False | 12853954560 |',
  'model': {'family': 'mpt',
            'layers': 40,
            'hidden': 5120,
            'heads': 40,
            'kv_heads': None,
            'ffn': 20480,
            'vocab': 50368,
            'seq': 2048,
            'params_b': 12.854,
            'hf_config': 'MptConfig',
            'tied_embeddings': True},
  'hardware': 'h100',
  'gpus': 512,
  'mesh': {'tp': 1, 'pp': 1, 'dp': 512, 'cp': 1, 'ep': 1, 'vp': 1},
  'fsdp': 'fsdp',
  'sequence_parallel': False,
  'schedule': None,
  'micro_batch': 16,
  'global_batch': 8192,
  'recompute': 'full',
  'precision': 'bf16',
  'torch_compile': False,
  'published': {'tflops_per_gpu': 406.0, 'tokens_per_s_per_gpu': 4952.0, 'mfu': 0.4112, 'step_s': None},
  'notes': "section 'H100 80GB BF16 (Large Scale, >= 128 GPUs)' (interconnect not stated). PyTorch FSDP FULL_SHARD "
           "(FULL_SHARD = ZeRO-3-like, SHARD_GRAD_OP = ZeRO-2-like), precision amp_bf16 / MP mode DEFAULT ('amp_bf16 "
           "DEFAULT' = autocast bf16 with fp32 master weights; 'bf16 PURE' = FSDP mixed precision with "
           'params/reduce/buffers in bf16); GradAccum 1; global_batch = MicroBatchSize*GradAccum*gpus = 8192 '
           'sequences; HFU 54.83%; samples/s 1238, tokens/s 2535811; NumParams 12853954560. Activation checkpointing '
           "True (FSDP per-block checkpointing -> 'full'). Columns: MFU | HFU | Model TFLOP | MicroBatchSize | "
           'GradAccum | GlobalBatchSize | Throughput (S/s) | (T/s) | (T/s/GPU) | ... | Precision | MP Mode | Sharding '
           'Strategy | Activation Checkpointing | ... | NumParams. Convention (README + collect_results.py): '
           'flops_per_seq = 2*n_params*seq, attn_flops_per_seq = n_layers*2*2*d_model*seq^2 (full, non-causal); Model '
           "TFLOP = (3*flops_per_seq + 3*attn_flops_per_seq) * samples/s / gpus; MFU against composer's "
           'GPU_AVAILABLE_FLOPS for the precision (h100-sxm / a100; MFU/Model-TFLOP ratios imply ~989 and ~312 '
           'TFLOP/s); HFU uses 4x instead of 3x when activation checkpointing is on. FLOPs exclude '
           'norms/activations/residuals. n_params includes the learned position embedding (NumParams varies with seq). '
           "Tables predate the torch-2.0 update ('TODO: Update tables with torch 2.0') -> torch_compile False. MPT "
           'architecture from scripts/train/yamls/pretrain/mpt-<size>.yaml at the fetched HEAD (d_model, n_heads, '
           'n_layers, expansion_ratio 4, vocab 50368, flash attention); MPTConfig defaults learned_pos_emb=True, '
           'tie_word_embeddings=True; GELU MLP (no gate). The yamls may have changed since the tables were produced '
           '(the 3b/1b yamls note heads modified for FlashAttention head dim 128); NumParams in the row is the '
           'authoritative size.'},
 {'id': 'mpt-7b-s2048-512gpu-h100',
  'source': 'mosaicml/llm-foundry scripts/train/benchmarking/README.md, H100 80GB BF16 (Large Scale, >= 128 GPUs)',
  'source_kind': 'repo',
  'quote': '|  7b | 2048 | 512 | h100_80gb | 42.2 | 42.2 | 417 | 6 | 1 | 3072 | 2417 | 4951479 | 9670 | 6291456 | '
           'amp_bf16 | DEFAULT | FULL_SHARD | False | False | 6658859008 |',
  'model': {'family': 'mpt',
            'layers': 32,
            'hidden': 4096,
            'heads': 32,
            'kv_heads': None,
            'ffn': 16384,
            'vocab': 50368,
            'seq': 2048,
            'params_b': 6.659,
            'hf_config': 'MptConfig',
            'tied_embeddings': True},
  'hardware': 'h100',
  'gpus': 512,
  'mesh': {'tp': 1, 'pp': 1, 'dp': 512, 'cp': 1, 'ep': 1, 'vp': 1},
  'fsdp': 'fsdp',
  'sequence_parallel': False,
  'schedule': None,
  'micro_batch': 6,
  'global_batch': 3072,
  'recompute': 'none',
  'precision': 'bf16',
  'torch_compile': False,
  'published': {'tflops_per_gpu': 417.0, 'tokens_per_s_per_gpu': 9670.0, 'mfu': 0.422, 'step_s': None},
  'notes': "section 'H100 80GB BF16 (Large Scale, >= 128 GPUs)' (interconnect not stated). PyTorch FSDP FULL_SHARD "
           "(FULL_SHARD = ZeRO-3-like, SHARD_GRAD_OP = ZeRO-2-like), precision amp_bf16 / MP mode DEFAULT ('amp_bf16 "
           "DEFAULT' = autocast bf16 with fp32 master weights; 'bf16 PURE' = FSDP mixed precision with "
           'params/reduce/buffers in bf16); GradAccum 1; global_batch = MicroBatchSize*GradAccum*gpus = 3072 '
           'sequences; HFU 42.2%; samples/s 2417, tokens/s 4951479; NumParams 6658859008. Activation checkpointing '
           "False (FSDP per-block checkpointing -> 'full'). Columns: MFU | HFU | Model TFLOP | MicroBatchSize | "
           'GradAccum | GlobalBatchSize | Throughput (S/s) | (T/s) | (T/s/GPU) | ... | Precision | MP Mode | Sharding '
           'Strategy | Activation Checkpointing | ... | NumParams. Convention (README + collect_results.py): '
           'flops_per_seq = 2*n_params*seq, attn_flops_per_seq = n_layers*2*2*d_model*seq^2 (full, non-causal); Model '
           "TFLOP = (3*flops_per_seq + 3*attn_flops_per_seq) * samples/s / gpus; MFU against composer's "
           'GPU_AVAILABLE_FLOPS for the precision (h100-sxm / a100; MFU/Model-TFLOP ratios imply ~989 and ~312 '
           'TFLOP/s); HFU uses 4x instead of 3x when activation checkpointing is on. FLOPs exclude '
           'norms/activations/residuals. n_params includes the learned position embedding (NumParams varies with seq). '
           "Tables predate the torch-2.0 update ('TODO: Update tables with torch 2.0') -> torch_compile False. MPT "
           'architecture from scripts/train/yamls/pretrain/mpt-<size>.yaml at the fetched HEAD (d_model, n_heads, '
           'n_layers, expansion_ratio 4, vocab 50368, flash attention); MPTConfig defaults learned_pos_emb=True, '
           'tie_word_embeddings=True; GELU MLP (no gate). The yamls may have changed since the tables were produced '
           '(the 3b/1b yamls note heads modified for FlashAttention head dim 128); NumParams in the row is the '
           'authoritative size.'},
 {'id': 'mpt-7b-s2048-128gpu-h100',
  'source': 'mosaicml/llm-foundry scripts/train/benchmarking/README.md, H100 80GB BF16 (Large Scale, >= 128 GPUs)',
  'source_kind': 'repo',
  'quote': '|  7b | 2048 | 128 | h100_80gb | 45.71 | 45.71 | 452 | 6 | 1 | 768 | 654 | 1340830 | 10475 | 1572864 | '
           'amp_bf16 | DEFAULT | FULL_SHARD | False | False | 6658859008 |',
  'model': {'family': 'mpt',
            'layers': 32,
            'hidden': 4096,
            'heads': 32,
            'kv_heads': None,
            'ffn': 16384,
            'vocab': 50368,
            'seq': 2048,
            'params_b': 6.659,
            'hf_config': 'MptConfig',
            'tied_embeddings': True},
  'hardware': 'h100',
  'gpus': 128,
  'mesh': {'tp': 1, 'pp': 1, 'dp': 128, 'cp': 1, 'ep': 1, 'vp': 1},
  'fsdp': 'fsdp',
  'sequence_parallel': False,
  'schedule': None,
  'micro_batch': 6,
  'global_batch': 768,
  'recompute': 'none',
  'precision': 'bf16',
  'torch_compile': False,
  'published': {'tflops_per_gpu': 452.0, 'tokens_per_s_per_gpu': 10475.0, 'mfu': 0.4571, 'step_s': None},
  'notes': "section 'H100 80GB BF16 (Large Scale, >= 128 GPUs)' (interconnect not stated). PyTorch FSDP FULL_SHARD "
           "(FULL_SHARD = ZeRO-3-like, SHARD_GRAD_OP = ZeRO-2-like), precision amp_bf16 / MP mode DEFAULT ('amp_bf16 "
           "DEFAULT' = autocast bf16 with fp32 master weights; 'bf16 PURE' = FSDP mixed precision with "
           'params/reduce/buffers in bf16); GradAccum 1; global_batch = MicroBatchSize*GradAccum*gpus = 768 sequences; '
           'HFU 45.71%; samples/s 654, tokens/s 1340830; NumParams 6658859008. Activation checkpointing False (FSDP '
           "per-block checkpointing -> 'full'). Columns: MFU | HFU | Model TFLOP | MicroBatchSize | GradAccum | "
           'GlobalBatchSize | Throughput (S/s) | (T/s) | (T/s/GPU) | ... | Precision | MP Mode | Sharding Strategy | '
           'Activation Checkpointing | ... | NumParams. Convention (README + collect_results.py): flops_per_seq = '
           '2*n_params*seq, attn_flops_per_seq = n_layers*2*2*d_model*seq^2 (full, non-causal); Model TFLOP = '
           "(3*flops_per_seq + 3*attn_flops_per_seq) * samples/s / gpus; MFU against composer's GPU_AVAILABLE_FLOPS "
           'for the precision (h100-sxm / a100; MFU/Model-TFLOP ratios imply ~989 and ~312 TFLOP/s); HFU uses 4x '
           'instead of 3x when activation checkpointing is on. FLOPs exclude norms/activations/residuals. n_params '
           'includes the learned position embedding (NumParams varies with seq). Tables predate the torch-2.0 update '
           "('TODO: Update tables with torch 2.0') -> torch_compile False. MPT architecture from "
           'scripts/train/yamls/pretrain/mpt-<size>.yaml at the fetched HEAD (d_model, n_heads, n_layers, '
           'expansion_ratio 4, vocab 50368, flash attention); MPTConfig defaults learned_pos_emb=True, '
           'tie_word_embeddings=True; GELU MLP (no gate). The yamls may have changed since the tables were produced '
           '(the 3b/1b yamls note heads modified for FlashAttention head dim 128); NumParams in the row is the '
           'authoritative size.'},
 {'id': 'mpt-3b-s2048-512gpu-h100',
  'source': 'mosaicml/llm-foundry scripts/train/benchmarking/README.md, H100 80GB BF16 (Large Scale, >= 128 GPUs)',
  'source_kind': 'repo',
  'quote': '|  3b | 2048 | 512 | h100_80gb | 39.24 | 39.24 | 388 | 8 | 1 | 4096 | 5416 | 11092218 | 21664 | 8388608 | '
           'amp_bf16 | DEFAULT | SHARD_GRAD_OP | False | False | 2651837440 |',
  'model': {'family': 'mpt',
            'layers': 32,
            'hidden': 2560,
            'heads': 20,
            'kv_heads': None,
            'ffn': 10240,
            'vocab': 50368,
            'seq': 2048,
            'params_b': 2.652,
            'hf_config': 'MptConfig',
            'tied_embeddings': True},
  'hardware': 'h100',
  'gpus': 512,
  'mesh': {'tp': 1, 'pp': 1, 'dp': 512, 'cp': 1, 'ep': 1, 'vp': 1},
  'fsdp': 'zero2',
  'sequence_parallel': False,
  'schedule': None,
  'micro_batch': 8,
  'global_batch': 4096,
  'recompute': 'none',
  'precision': 'bf16',
  'torch_compile': False,
  'published': {'tflops_per_gpu': 388.0, 'tokens_per_s_per_gpu': 21664.0, 'mfu': 0.3924, 'step_s': None},
  'notes': "section 'H100 80GB BF16 (Large Scale, >= 128 GPUs)' (interconnect not stated). PyTorch FSDP SHARD_GRAD_OP "
           "(FULL_SHARD = ZeRO-3-like, SHARD_GRAD_OP = ZeRO-2-like), precision amp_bf16 / MP mode DEFAULT ('amp_bf16 "
           "DEFAULT' = autocast bf16 with fp32 master weights; 'bf16 PURE' = FSDP mixed precision with "
           'params/reduce/buffers in bf16); GradAccum 1; global_batch = MicroBatchSize*GradAccum*gpus = 4096 '
           'sequences; HFU 39.24%; samples/s 5416, tokens/s 11092218; NumParams 2651837440. Activation checkpointing '
           "False (FSDP per-block checkpointing -> 'full'). Columns: MFU | HFU | Model TFLOP | MicroBatchSize | "
           'GradAccum | GlobalBatchSize | Throughput (S/s) | (T/s) | (T/s/GPU) | ... | Precision | MP Mode | Sharding '
           'Strategy | Activation Checkpointing | ... | NumParams. Convention (README + collect_results.py): '
           'flops_per_seq = 2*n_params*seq, attn_flops_per_seq = n_layers*2*2*d_model*seq^2 (full, non-causal); Model '
           "TFLOP = (3*flops_per_seq + 3*attn_flops_per_seq) * samples/s / gpus; MFU against composer's "
           'GPU_AVAILABLE_FLOPS for the precision (h100-sxm / a100; MFU/Model-TFLOP ratios imply ~989 and ~312 '
           'TFLOP/s); HFU uses 4x instead of 3x when activation checkpointing is on. FLOPs exclude '
           'norms/activations/residuals. n_params includes the learned position embedding (NumParams varies with seq). '
           "Tables predate the torch-2.0 update ('TODO: Update tables with torch 2.0') -> torch_compile False. MPT "
           'architecture from scripts/train/yamls/pretrain/mpt-<size>.yaml at the fetched HEAD (d_model, n_heads, '
           'n_layers, expansion_ratio 4, vocab 50368, flash attention); MPTConfig defaults learned_pos_emb=True, '
           'tie_word_embeddings=True; GELU MLP (no gate). The yamls may have changed since the tables were produced '
           '(the 3b/1b yamls note heads modified for FlashAttention head dim 128); NumParams in the row is the '
           'authoritative size.'},
 {'id': 'mpt-1b-s2048-128gpu-h100',
  'source': 'mosaicml/llm-foundry scripts/train/benchmarking/README.md, H100 80GB BF16 (Large Scale, >= 128 GPUs)',
  'source_kind': 'repo',
  'quote': '|  1b | 2048 | 128 | h100_80gb | 40.6 | 40.6 | 401 | 12 | 1 | 1536 | 2757 | 5647854 | 44123 | 3145728 | '
           'amp_bf16 | DEFAULT | SHARD_GRAD_OP | False | False | 1315950592 |',
  'model': {'family': 'mpt',
            'layers': 24,
            'hidden': 2048,
            'heads': 16,
            'kv_heads': None,
            'ffn': 8192,
            'vocab': 50368,
            'seq': 2048,
            'params_b': 1.316,
            'hf_config': 'MptConfig',
            'tied_embeddings': True},
  'hardware': 'h100',
  'gpus': 128,
  'mesh': {'tp': 1, 'pp': 1, 'dp': 128, 'cp': 1, 'ep': 1, 'vp': 1},
  'fsdp': 'zero2',
  'sequence_parallel': False,
  'schedule': None,
  'micro_batch': 12,
  'global_batch': 1536,
  'recompute': 'none',
  'precision': 'bf16',
  'torch_compile': False,
  'published': {'tflops_per_gpu': 401.0, 'tokens_per_s_per_gpu': 44123.0, 'mfu': 0.406, 'step_s': None},
  'notes': "section 'H100 80GB BF16 (Large Scale, >= 128 GPUs)' (interconnect not stated). PyTorch FSDP SHARD_GRAD_OP "
           "(FULL_SHARD = ZeRO-3-like, SHARD_GRAD_OP = ZeRO-2-like), precision amp_bf16 / MP mode DEFAULT ('amp_bf16 "
           "DEFAULT' = autocast bf16 with fp32 master weights; 'bf16 PURE' = FSDP mixed precision with "
           'params/reduce/buffers in bf16); GradAccum 1; global_batch = MicroBatchSize*GradAccum*gpus = 1536 '
           'sequences; HFU 40.6%; samples/s 2757, tokens/s 5647854; NumParams 1315950592. Activation checkpointing '
           "False (FSDP per-block checkpointing -> 'full'). Columns: MFU | HFU | Model TFLOP | MicroBatchSize | "
           'GradAccum | GlobalBatchSize | Throughput (S/s) | (T/s) | (T/s/GPU) | ... | Precision | MP Mode | Sharding '
           'Strategy | Activation Checkpointing | ... | NumParams. Convention (README + collect_results.py): '
           'flops_per_seq = 2*n_params*seq, attn_flops_per_seq = n_layers*2*2*d_model*seq^2 (full, non-causal); Model '
           "TFLOP = (3*flops_per_seq + 3*attn_flops_per_seq) * samples/s / gpus; MFU against composer's "
           'GPU_AVAILABLE_FLOPS for the precision (h100-sxm / a100; MFU/Model-TFLOP ratios imply ~989 and ~312 '
           'TFLOP/s); HFU uses 4x instead of 3x when activation checkpointing is on. FLOPs exclude '
           'norms/activations/residuals. n_params includes the learned position embedding (NumParams varies with seq). '
           "Tables predate the torch-2.0 update ('TODO: Update tables with torch 2.0') -> torch_compile False. MPT "
           'architecture from scripts/train/yamls/pretrain/mpt-<size>.yaml at the fetched HEAD (d_model, n_heads, '
           'n_layers, expansion_ratio 4, vocab 50368, flash attention); MPTConfig defaults learned_pos_emb=True, '
           'tie_word_embeddings=True; GELU MLP (no gate). The yamls may have changed since the tables were produced '
           '(the 3b/1b yamls note heads modified for FlashAttention head dim 128); NumParams in the row is the '
           'authoritative size.'},
 {'id': 'mpt-70b-s2048-64gpu-h100',
  'source': 'mosaicml/llm-foundry scripts/train/benchmarking/README.md, H100 80GB BF16',
  'source_kind': 'repo',
  'quote': '|  70b | 2048 | 64 | h100_80gb | 42.57 | 56.76 | 421 | 8 | 4 | 2048 | 32 | 66523 | 1039 | 4194304 | '
           'amp_bf16 | DEFAULT | FULL_SHARD | True | False | 64862437376 |',
  'model': {'family': 'mpt',
            'layers': 80,
            'hidden': 8192,
            'heads': 64,
            'kv_heads': None,
            'ffn': 32768,
            'vocab': 50368,
            'seq': 2048,
            'params_b': 64.862,
            'hf_config': 'MptConfig',
            'tied_embeddings': True},
  'hardware': 'h100',
  'gpus': 64,
  'mesh': {'tp': 1, 'pp': 1, 'dp': 64, 'cp': 1, 'ep': 1, 'vp': 1},
  'fsdp': 'fsdp',
  'sequence_parallel': False,
  'schedule': None,
  'micro_batch': 8,
  'global_batch': 2048,
  'recompute': 'full',
  'precision': 'bf16',
  'torch_compile': False,
  'published': {'tflops_per_gpu': 421.0, 'tokens_per_s_per_gpu': 1039.0, 'mfu': 0.4257, 'step_s': None},
  'notes': "section 'H100 80GB BF16' (interconnect not stated). PyTorch FSDP FULL_SHARD (FULL_SHARD = ZeRO-3-like, "
           "SHARD_GRAD_OP = ZeRO-2-like), precision amp_bf16 / MP mode DEFAULT ('amp_bf16 DEFAULT' = autocast bf16 "
           "with fp32 master weights; 'bf16 PURE' = FSDP mixed precision with params/reduce/buffers in bf16); "
           'GradAccum 4; global_batch = MicroBatchSize*GradAccum*gpus = 2048 sequences; HFU 56.76%; samples/s 32, '
           'tokens/s 66523; NumParams 64862437376. Activation checkpointing True (FSDP per-block checkpointing -> '
           "'full'). Columns: MFU | HFU | Model TFLOP | MicroBatchSize | GradAccum | GlobalBatchSize | Throughput "
           '(S/s) | (T/s) | (T/s/GPU) | ... | Precision | MP Mode | Sharding Strategy | Activation Checkpointing | ... '
           '| NumParams. Convention (README + collect_results.py): flops_per_seq = 2*n_params*seq, attn_flops_per_seq '
           '= n_layers*2*2*d_model*seq^2 (full, non-causal); Model TFLOP = (3*flops_per_seq + 3*attn_flops_per_seq) * '
           "samples/s / gpus; MFU against composer's GPU_AVAILABLE_FLOPS for the precision (h100-sxm / a100; "
           'MFU/Model-TFLOP ratios imply ~989 and ~312 TFLOP/s); HFU uses 4x instead of 3x when activation '
           'checkpointing is on. FLOPs exclude norms/activations/residuals. n_params includes the learned position '
           "embedding (NumParams varies with seq). Tables predate the torch-2.0 update ('TODO: Update tables with "
           "torch 2.0') -> torch_compile False. MPT architecture from scripts/train/yamls/pretrain/mpt-<size>.yaml at "
           'the fetched HEAD (d_model, n_heads, n_layers, expansion_ratio 4, vocab 50368, flash attention); MPTConfig '
           'defaults learned_pos_emb=True, tie_word_embeddings=True; GELU MLP (no gate). The yamls may have changed '
           'since the tables were produced (the 3b/1b yamls note heads modified for FlashAttention head dim 128); '
           'NumParams in the row is the authoritative size.'},
 {'id': 'mpt-30b-s2048-8gpu-h100',
  'source': 'mosaicml/llm-foundry scripts/train/benchmarking/README.md, H100 80GB BF16',
  'source_kind': 'repo',
  'quote': '|  30b | 2048 | 8 | h100_80gb | 38.11 | 50.82 | 377 | 3 | 21 | 504 | 7 | 16022 | 2002 | 1032192 | amp_bf16 '
           '| DEFAULT | FULL_SHARD | True | False | 29975214080 |',
  'model': {'family': 'mpt',
            'layers': 48,
            'hidden': 7168,
            'heads': 56,
            'kv_heads': None,
            'ffn': 28672,
            'vocab': 50368,
            'seq': 2048,
            'params_b': 29.975,
            'hf_config': 'MptConfig',
            'tied_embeddings': True},
  'hardware': 'h100',
  'gpus': 8,
  'mesh': {'tp': 1, 'pp': 1, 'dp': 8, 'cp': 1, 'ep': 1, 'vp': 1},
  'fsdp': 'fsdp',
  'sequence_parallel': False,
  'schedule': None,
  'micro_batch': 3,
  'global_batch': 504,
  'recompute': 'full',
  'precision': 'bf16',
  'torch_compile': False,
  'published': {'tflops_per_gpu': 377.0, 'tokens_per_s_per_gpu': 2002.0, 'mfu': 0.3811, 'step_s': None},
  'notes': "section 'H100 80GB BF16' (interconnect not stated). PyTorch FSDP FULL_SHARD (FULL_SHARD = ZeRO-3-like, "
           "SHARD_GRAD_OP = ZeRO-2-like), precision amp_bf16 / MP mode DEFAULT ('amp_bf16 DEFAULT' = autocast bf16 "
           "with fp32 master weights; 'bf16 PURE' = FSDP mixed precision with params/reduce/buffers in bf16); "
           'GradAccum 21; global_batch = MicroBatchSize*GradAccum*gpus = 504 sequences; HFU 50.82%; samples/s 7, '
           'tokens/s 16022; NumParams 29975214080. Activation checkpointing True (FSDP per-block checkpointing -> '
           "'full'). Columns: MFU | HFU | Model TFLOP | MicroBatchSize | GradAccum | GlobalBatchSize | Throughput "
           '(S/s) | (T/s) | (T/s/GPU) | ... | Precision | MP Mode | Sharding Strategy | Activation Checkpointing | ... '
           '| NumParams. Convention (README + collect_results.py): flops_per_seq = 2*n_params*seq, attn_flops_per_seq '
           '= n_layers*2*2*d_model*seq^2 (full, non-causal); Model TFLOP = (3*flops_per_seq + 3*attn_flops_per_seq) * '
           "samples/s / gpus; MFU against composer's GPU_AVAILABLE_FLOPS for the precision (h100-sxm / a100; "
           'MFU/Model-TFLOP ratios imply ~989 and ~312 TFLOP/s); HFU uses 4x instead of 3x when activation '
           'checkpointing is on. FLOPs exclude norms/activations/residuals. n_params includes the learned position '
           "embedding (NumParams varies with seq). Tables predate the torch-2.0 update ('TODO: Update tables with "
           "torch 2.0') -> torch_compile False. MPT architecture from scripts/train/yamls/pretrain/mpt-<size>.yaml at "
           'the fetched HEAD (d_model, n_heads, n_layers, expansion_ratio 4, vocab 50368, flash attention); MPTConfig '
           'defaults learned_pos_emb=True, tie_word_embeddings=True; GELU MLP (no gate). The yamls may have changed '
           'since the tables were produced (the 3b/1b yamls note heads modified for FlashAttention head dim 128); '
           'NumParams in the row is the authoritative size.'},
 {'id': 'mpt-13b-s2048-8gpu-h100',
  'source': 'mosaicml/llm-foundry scripts/train/benchmarking/README.md, H100 80GB BF16',
  'source_kind': 'repo',
  'quote': '|  13b | 2048 | 8 | h100_80gb | 39.79 | 39.79 | 393 | 2 | 1 | 16 | 18 | 38336 | 4792 | 32768 | amp_bf16 | '
           'DEFAULT | FULL_SHARD | False | False | 12853954560 |',
  'model': {'family': 'mpt',
            'layers': 40,
            'hidden': 5120,
            'heads': 40,
            'kv_heads': None,
            'ffn': 20480,
            'vocab': 50368,
            'seq': 2048,
            'params_b': 12.854,
            'hf_config': 'MptConfig',
            'tied_embeddings': True},
  'hardware': 'h100',
  'gpus': 8,
  'mesh': {'tp': 1, 'pp': 1, 'dp': 8, 'cp': 1, 'ep': 1, 'vp': 1},
  'fsdp': 'fsdp',
  'sequence_parallel': False,
  'schedule': None,
  'micro_batch': 2,
  'global_batch': 16,
  'recompute': 'none',
  'precision': 'bf16',
  'torch_compile': False,
  'published': {'tflops_per_gpu': 393.0, 'tokens_per_s_per_gpu': 4792.0, 'mfu': 0.3979, 'step_s': None},
  'notes': "section 'H100 80GB BF16' (interconnect not stated). PyTorch FSDP FULL_SHARD (FULL_SHARD = ZeRO-3-like, "
           "SHARD_GRAD_OP = ZeRO-2-like), precision amp_bf16 / MP mode DEFAULT ('amp_bf16 DEFAULT' = autocast bf16 "
           "with fp32 master weights; 'bf16 PURE' = FSDP mixed precision with params/reduce/buffers in bf16); "
           'GradAccum 1; global_batch = MicroBatchSize*GradAccum*gpus = 16 sequences; HFU 39.79%; samples/s 18, '
           'tokens/s 38336; NumParams 12853954560. Activation checkpointing False (FSDP per-block checkpointing -> '
           "'full'). Columns: MFU | HFU | Model TFLOP | MicroBatchSize | GradAccum | GlobalBatchSize | Throughput "
           '(S/s) | (T/s) | (T/s/GPU) | ... | Precision | MP Mode | Sharding Strategy | Activation Checkpointing | ... '
           '| NumParams. Convention (README + collect_results.py): flops_per_seq = 2*n_params*seq, attn_flops_per_seq '
           '= n_layers*2*2*d_model*seq^2 (full, non-causal); Model TFLOP = (3*flops_per_seq + 3*attn_flops_per_seq) * '
           "samples/s / gpus; MFU against composer's GPU_AVAILABLE_FLOPS for the precision (h100-sxm / a100; "
           'MFU/Model-TFLOP ratios imply ~989 and ~312 TFLOP/s); HFU uses 4x instead of 3x when activation '
           'checkpointing is on. FLOPs exclude norms/activations/residuals. n_params includes the learned position '
           "embedding (NumParams varies with seq). Tables predate the torch-2.0 update ('TODO: Update tables with "
           "torch 2.0') -> torch_compile False. MPT architecture from scripts/train/yamls/pretrain/mpt-<size>.yaml at "
           'the fetched HEAD (d_model, n_heads, n_layers, expansion_ratio 4, vocab 50368, flash attention); MPTConfig '
           'defaults learned_pos_emb=True, tie_word_embeddings=True; GELU MLP (no gate). The yamls may have changed '
           'since the tables were produced (the 3b/1b yamls note heads modified for FlashAttention head dim 128); '
           'NumParams in the row is the authoritative size.'},
 {'id': 'mpt-7b-s2048-8gpu-h100',
  'source': 'mosaicml/llm-foundry scripts/train/benchmarking/README.md, H100 80GB BF16',
  'source_kind': 'repo',
  'quote': '|  7b | 2048 | 8 | h100_80gb | 46.44 | 46.44 | 459 | 6 | 1 | 48 | 41 | 85144 | 10643 | 98304 | amp_bf16 | '
           'DEFAULT | FULL_SHARD | False | False | 6658859008 |',
  'model': {'family': 'mpt',
            'layers': 32,
            'hidden': 4096,
            'heads': 32,
            'kv_heads': None,
            'ffn': 16384,
            'vocab': 50368,
            'seq': 2048,
            'params_b': 6.659,
            'hf_config': 'MptConfig',
            'tied_embeddings': True},
  'hardware': 'h100',
  'gpus': 8,
  'mesh': {'tp': 1, 'pp': 1, 'dp': 8, 'cp': 1, 'ep': 1, 'vp': 1},
  'fsdp': 'fsdp',
  'sequence_parallel': False,
  'schedule': None,
  'micro_batch': 6,
  'global_batch': 48,
  'recompute': 'none',
  'precision': 'bf16',
  'torch_compile': False,
  'published': {'tflops_per_gpu': 459.0, 'tokens_per_s_per_gpu': 10643.0, 'mfu': 0.4644, 'step_s': None},
  'notes': "section 'H100 80GB BF16' (interconnect not stated). PyTorch FSDP FULL_SHARD (FULL_SHARD = ZeRO-3-like, "
           "SHARD_GRAD_OP = ZeRO-2-like), precision amp_bf16 / MP mode DEFAULT ('amp_bf16 DEFAULT' = autocast bf16 "
           "with fp32 master weights; 'bf16 PURE' = FSDP mixed precision with params/reduce/buffers in bf16); "
           'GradAccum 1; global_batch = MicroBatchSize*GradAccum*gpus = 48 sequences; HFU 46.44%; samples/s 41, '
           'tokens/s 85144; NumParams 6658859008. Activation checkpointing False (FSDP per-block checkpointing -> '
           "'full'). Columns: MFU | HFU | Model TFLOP | MicroBatchSize | GradAccum | GlobalBatchSize | Throughput "
           '(S/s) | (T/s) | (T/s/GPU) | ... | Precision | MP Mode | Sharding Strategy | Activation Checkpointing | ... '
           '| NumParams. Convention (README + collect_results.py): flops_per_seq = 2*n_params*seq, attn_flops_per_seq '
           '= n_layers*2*2*d_model*seq^2 (full, non-causal); Model TFLOP = (3*flops_per_seq + 3*attn_flops_per_seq) * '
           "samples/s / gpus; MFU against composer's GPU_AVAILABLE_FLOPS for the precision (h100-sxm / a100; "
           'MFU/Model-TFLOP ratios imply ~989 and ~312 TFLOP/s); HFU uses 4x instead of 3x when activation '
           'checkpointing is on. FLOPs exclude norms/activations/residuals. n_params includes the learned position '
           "embedding (NumParams varies with seq). Tables predate the torch-2.0 update ('TODO: Update tables with "
           "torch 2.0') -> torch_compile False. MPT architecture from scripts/train/yamls/pretrain/mpt-<size>.yaml at "
           'the fetched HEAD (d_model, n_heads, n_layers, expansion_ratio 4, vocab 50368, flash attention); MPTConfig '
           'defaults learned_pos_emb=True, tie_word_embeddings=True; GELU MLP (no gate). The yamls may have changed '
           'since the tables were produced (the 3b/1b yamls note heads modified for FlashAttention head dim 128); '
           'NumParams in the row is the authoritative size.'},
 {'id': 'mpt-7b-s8192-8gpu-h100',
  'source': 'mosaicml/llm-foundry scripts/train/benchmarking/README.md, H100 80GB BF16',
  'source_kind': 'repo',
  'quote': '|  7b | 8192 | 8 | h100_80gb | 37.14 | 49.52 | 367 | 8 | 2 | 128 | 6 | 55481 | 6935 | 1048576 | amp_bf16 | '
           'DEFAULT | FULL_SHARD | True | False | 6684024832 |',
  'model': {'family': 'mpt',
            'layers': 32,
            'hidden': 4096,
            'heads': 32,
            'kv_heads': None,
            'ffn': 16384,
            'vocab': 50368,
            'seq': 8192,
            'params_b': 6.684,
            'hf_config': 'MptConfig',
            'tied_embeddings': True},
  'hardware': 'h100',
  'gpus': 8,
  'mesh': {'tp': 1, 'pp': 1, 'dp': 8, 'cp': 1, 'ep': 1, 'vp': 1},
  'fsdp': 'fsdp',
  'sequence_parallel': False,
  'schedule': None,
  'micro_batch': 8,
  'global_batch': 128,
  'recompute': 'full',
  'precision': 'bf16',
  'torch_compile': False,
  'published': {'tflops_per_gpu': 367.0, 'tokens_per_s_per_gpu': 6935.0, 'mfu': 0.3714, 'step_s': None},
  'notes': "section 'H100 80GB BF16' (interconnect not stated). PyTorch FSDP FULL_SHARD (FULL_SHARD = ZeRO-3-like, "
           "SHARD_GRAD_OP = ZeRO-2-like), precision amp_bf16 / MP mode DEFAULT ('amp_bf16 DEFAULT' = autocast bf16 "
           "with fp32 master weights; 'bf16 PURE' = FSDP mixed precision with params/reduce/buffers in bf16); "
           'GradAccum 2; global_batch = MicroBatchSize*GradAccum*gpus = 128 sequences; HFU 49.52%; samples/s 6, '
           'tokens/s 55481; NumParams 6684024832. Activation checkpointing True (FSDP per-block checkpointing -> '
           "'full'). Columns: MFU | HFU | Model TFLOP | MicroBatchSize | GradAccum | GlobalBatchSize | Throughput "
           '(S/s) | (T/s) | (T/s/GPU) | ... | Precision | MP Mode | Sharding Strategy | Activation Checkpointing | ... '
           '| NumParams. Convention (README + collect_results.py): flops_per_seq = 2*n_params*seq, attn_flops_per_seq '
           '= n_layers*2*2*d_model*seq^2 (full, non-causal); Model TFLOP = (3*flops_per_seq + 3*attn_flops_per_seq) * '
           "samples/s / gpus; MFU against composer's GPU_AVAILABLE_FLOPS for the precision (h100-sxm / a100; "
           'MFU/Model-TFLOP ratios imply ~989 and ~312 TFLOP/s); HFU uses 4x instead of 3x when activation '
           'checkpointing is on. FLOPs exclude norms/activations/residuals. n_params includes the learned position '
           "embedding (NumParams varies with seq). Tables predate the torch-2.0 update ('TODO: Update tables with "
           "torch 2.0') -> torch_compile False. MPT architecture from scripts/train/yamls/pretrain/mpt-<size>.yaml at "
           'the fetched HEAD (d_model, n_heads, n_layers, expansion_ratio 4, vocab 50368, flash attention); MPTConfig '
           'defaults learned_pos_emb=True, tie_word_embeddings=True; GELU MLP (no gate). The yamls may have changed '
           'since the tables were produced (the 3b/1b yamls note heads modified for FlashAttention head dim 128); '
           'NumParams in the row is the authoritative size.'},
 {'id': 'mpt-7b-s32768-8gpu-h100',
  'source': 'mosaicml/llm-foundry scripts/train/benchmarking/README.md, H100 80GB BF16',
  'source_kind': 'repo',
  'quote': '|  7b | 32768 | 8 | h100_80gb | 30.94 | 41.25 | 306 | 2 | 2 | 32 | 0 | 26550 | 3318 | 1048576 | amp_bf16 | '
           'DEFAULT | FULL_SHARD | True | False | 6784688128 |',
  'model': {'family': 'mpt',
            'layers': 32,
            'hidden': 4096,
            'heads': 32,
            'kv_heads': None,
            'ffn': 16384,
            'vocab': 50368,
            'seq': 32768,
            'params_b': 6.785,
            'hf_config': 'MptConfig',
            'tied_embeddings': True},
  'hardware': 'h100',
  'gpus': 8,
  'mesh': {'tp': 1, 'pp': 1, 'dp': 8, 'cp': 1, 'ep': 1, 'vp': 1},
  'fsdp': 'fsdp',
  'sequence_parallel': False,
  'schedule': None,
  'micro_batch': 2,
  'global_batch': 32,
  'recompute': 'full',
  'precision': 'bf16',
  'torch_compile': False,
  'published': {'tflops_per_gpu': 306.0, 'tokens_per_s_per_gpu': 3318.0, 'mfu': 0.3094, 'step_s': None},
  'notes': "section 'H100 80GB BF16' (interconnect not stated). PyTorch FSDP FULL_SHARD (FULL_SHARD = ZeRO-3-like, "
           "SHARD_GRAD_OP = ZeRO-2-like), precision amp_bf16 / MP mode DEFAULT ('amp_bf16 DEFAULT' = autocast bf16 "
           "with fp32 master weights; 'bf16 PURE' = FSDP mixed precision with params/reduce/buffers in bf16); "
           'GradAccum 2; global_batch = MicroBatchSize*GradAccum*gpus = 32 sequences; HFU 41.25%; samples/s 0, '
           'tokens/s 26550; NumParams 6784688128. Activation checkpointing True (FSDP per-block checkpointing -> '
           "'full'). Columns: MFU | HFU | Model TFLOP | MicroBatchSize | GradAccum | GlobalBatchSize | Throughput "
           '(S/s) | (T/s) | (T/s/GPU) | ... | Precision | MP Mode | Sharding Strategy | Activation Checkpointing | ... '
           '| NumParams. Convention (README + collect_results.py): flops_per_seq = 2*n_params*seq, attn_flops_per_seq '
           '= n_layers*2*2*d_model*seq^2 (full, non-causal); Model TFLOP = (3*flops_per_seq + 3*attn_flops_per_seq) * '
           "samples/s / gpus; MFU against composer's GPU_AVAILABLE_FLOPS for the precision (h100-sxm / a100; "
           'MFU/Model-TFLOP ratios imply ~989 and ~312 TFLOP/s); HFU uses 4x instead of 3x when activation '
           'checkpointing is on. FLOPs exclude norms/activations/residuals. n_params includes the learned position '
           "embedding (NumParams varies with seq). Tables predate the torch-2.0 update ('TODO: Update tables with "
           "torch 2.0') -> torch_compile False. MPT architecture from scripts/train/yamls/pretrain/mpt-<size>.yaml at "
           'the fetched HEAD (d_model, n_heads, n_layers, expansion_ratio 4, vocab 50368, flash attention); MPTConfig '
           'defaults learned_pos_emb=True, tie_word_embeddings=True; GELU MLP (no gate). The yamls may have changed '
           'since the tables were produced (the 3b/1b yamls note heads modified for FlashAttention head dim 128); '
           'NumParams in the row is the authoritative size.'},
 {'id': 'mpt-70b-s2048-64gpu-a100-80gb',
  'source': 'mosaicml/llm-foundry scripts/train/benchmarking/README.md, A100 80GB with 1600 Gbps node-node '
            'interconnect (RoCE)',
  'source_kind': 'repo',
  'quote': '|  70b | 2048 | 64 | a100_80gb | 53.33 | 71.1 | 166 | 8 | 4 | 2048 | 12 | 26274 | 410 | 4194304 | bf16 | '
           'PURE | FULL_SHARD | True | False | 64862437376 |',
  'model': {'family': 'mpt',
            'layers': 80,
            'hidden': 8192,
            'heads': 64,
            'kv_heads': None,
            'ffn': 32768,
            'vocab': 50368,
            'seq': 2048,
            'params_b': 64.862,
            'hf_config': 'MptConfig',
            'tied_embeddings': True},
  'hardware': 'a100-80gb',
  'gpus': 64,
  'mesh': {'tp': 1, 'pp': 1, 'dp': 64, 'cp': 1, 'ep': 1, 'vp': 1},
  'fsdp': 'fsdp',
  'sequence_parallel': False,
  'schedule': None,
  'micro_batch': 8,
  'global_batch': 2048,
  'recompute': 'full',
  'precision': 'bf16',
  'torch_compile': False,
  'published': {'tflops_per_gpu': 166.0, 'tokens_per_s_per_gpu': 410.0, 'mfu': 0.5333, 'step_s': None},
  'notes': "section 'A100 80GB with 1600 Gbps node-node interconnect (RoCE)'. PyTorch FSDP FULL_SHARD (FULL_SHARD = "
           "ZeRO-3-like, SHARD_GRAD_OP = ZeRO-2-like), precision bf16 / MP mode PURE ('amp_bf16 DEFAULT' = autocast "
           "bf16 with fp32 master weights; 'bf16 PURE' = FSDP mixed precision with params/reduce/buffers in bf16); "
           'GradAccum 4; global_batch = MicroBatchSize*GradAccum*gpus = 2048 sequences; HFU 71.1%; samples/s 12, '
           'tokens/s 26274; NumParams 64862437376. Activation checkpointing True (FSDP per-block checkpointing -> '
           "'full'). Columns: MFU | HFU | Model TFLOP | MicroBatchSize | GradAccum | GlobalBatchSize | Throughput "
           '(S/s) | (T/s) | (T/s/GPU) | ... | Precision | MP Mode | Sharding Strategy | Activation Checkpointing | ... '
           '| NumParams. Convention (README + collect_results.py): flops_per_seq = 2*n_params*seq, attn_flops_per_seq '
           '= n_layers*2*2*d_model*seq^2 (full, non-causal); Model TFLOP = (3*flops_per_seq + 3*attn_flops_per_seq) * '
           "samples/s / gpus; MFU against composer's GPU_AVAILABLE_FLOPS for the precision (h100-sxm / a100; "
           'MFU/Model-TFLOP ratios imply ~989 and ~312 TFLOP/s); HFU uses 4x instead of 3x when activation '
           'checkpointing is on. FLOPs exclude norms/activations/residuals. n_params includes the learned position '
           "embedding (NumParams varies with seq). Tables predate the torch-2.0 update ('TODO: Update tables with "
           "torch 2.0') -> torch_compile False. MPT architecture from scripts/train/yamls/pretrain/mpt-<size>.yaml at "
           'the fetched HEAD (d_model, n_heads, n_layers, expansion_ratio 4, vocab 50368, flash attention); MPTConfig '
           'defaults learned_pos_emb=True, tie_word_embeddings=True; GELU MLP (no gate). The yamls may have changed '
           'since the tables were produced (the 3b/1b yamls note heads modified for FlashAttention head dim 128); '
           'NumParams in the row is the authoritative size.'},
 {'id': 'mpt-30b-s2048-8gpu-a100-80gb',
  'source': 'mosaicml/llm-foundry scripts/train/benchmarking/README.md, A100 80GB with 1600 Gbps node-node '
            'interconnect (RoCE)',
  'source_kind': 'repo',
  'quote': '|  30b | 2048 | 8 | a100_80gb | 55.3 | 73.74 | 172 | 3 | 21 | 504 | 3 | 7330 | 916 | 1032192 | amp_bf16 | '
           'DEFAULT | FULL_SHARD | True | False | 29975214080 |',
  'model': {'family': 'mpt',
            'layers': 48,
            'hidden': 7168,
            'heads': 56,
            'kv_heads': None,
            'ffn': 28672,
            'vocab': 50368,
            'seq': 2048,
            'params_b': 29.975,
            'hf_config': 'MptConfig',
            'tied_embeddings': True},
  'hardware': 'a100-80gb',
  'gpus': 8,
  'mesh': {'tp': 1, 'pp': 1, 'dp': 8, 'cp': 1, 'ep': 1, 'vp': 1},
  'fsdp': 'fsdp',
  'sequence_parallel': False,
  'schedule': None,
  'micro_batch': 3,
  'global_batch': 504,
  'recompute': 'full',
  'precision': 'bf16',
  'torch_compile': False,
  'published': {'tflops_per_gpu': 172.0, 'tokens_per_s_per_gpu': 916.0, 'mfu': 0.553, 'step_s': None},
  'notes': "section 'A100 80GB with 1600 Gbps node-node interconnect (RoCE)'. PyTorch FSDP FULL_SHARD (FULL_SHARD = "
           "ZeRO-3-like, SHARD_GRAD_OP = ZeRO-2-like), precision amp_bf16 / MP mode DEFAULT ('amp_bf16 DEFAULT' = "
           "autocast bf16 with fp32 master weights; 'bf16 PURE' = FSDP mixed precision with params/reduce/buffers in "
           'bf16); GradAccum 21; global_batch = MicroBatchSize*GradAccum*gpus = 504 sequences; HFU 73.74%; samples/s '
           '3, tokens/s 7330; NumParams 29975214080. Activation checkpointing True (FSDP per-block checkpointing -> '
           "'full'). Columns: MFU | HFU | Model TFLOP | MicroBatchSize | GradAccum | GlobalBatchSize | Throughput "
           '(S/s) | (T/s) | (T/s/GPU) | ... | Precision | MP Mode | Sharding Strategy | Activation Checkpointing | ... '
           '| NumParams. Convention (README + collect_results.py): flops_per_seq = 2*n_params*seq, attn_flops_per_seq '
           '= n_layers*2*2*d_model*seq^2 (full, non-causal); Model TFLOP = (3*flops_per_seq + 3*attn_flops_per_seq) * '
           "samples/s / gpus; MFU against composer's GPU_AVAILABLE_FLOPS for the precision (h100-sxm / a100; "
           'MFU/Model-TFLOP ratios imply ~989 and ~312 TFLOP/s); HFU uses 4x instead of 3x when activation '
           'checkpointing is on. FLOPs exclude norms/activations/residuals. n_params includes the learned position '
           "embedding (NumParams varies with seq). Tables predate the torch-2.0 update ('TODO: Update tables with "
           "torch 2.0') -> torch_compile False. MPT architecture from scripts/train/yamls/pretrain/mpt-<size>.yaml at "
           'the fetched HEAD (d_model, n_heads, n_layers, expansion_ratio 4, vocab 50368, flash attention); MPTConfig '
           'defaults learned_pos_emb=True, tie_word_embeddings=True; GELU MLP (no gate). The yamls may have changed '
           'since the tables were produced (the 3b/1b yamls note heads modified for FlashAttention head dim 128); '
           'NumParams in the row is the authoritative size.'},
 {'id': 'mpt-13b-s2048-8gpu-a100-80gb',
  'source': 'mosaicml/llm-foundry scripts/train/benchmarking/README.md, A100 80GB with 1600 Gbps node-node '
            'interconnect (RoCE)',
  'source_kind': 'repo',
  'quote': '|  13b | 2048 | 8 | a100_80gb | 59.57 | 59.57 | 185 | 2 | 3 | 48 | 8 | 18097 | 2262 | 98304 | amp_bf16 | '
           'DEFAULT | FULL_SHARD | False | False | 12853954560 |',
  'model': {'family': 'mpt',
            'layers': 40,
            'hidden': 5120,
            'heads': 40,
            'kv_heads': None,
            'ffn': 20480,
            'vocab': 50368,
            'seq': 2048,
            'params_b': 12.854,
            'hf_config': 'MptConfig',
            'tied_embeddings': True},
  'hardware': 'a100-80gb',
  'gpus': 8,
  'mesh': {'tp': 1, 'pp': 1, 'dp': 8, 'cp': 1, 'ep': 1, 'vp': 1},
  'fsdp': 'fsdp',
  'sequence_parallel': False,
  'schedule': None,
  'micro_batch': 2,
  'global_batch': 48,
  'recompute': 'none',
  'precision': 'bf16',
  'torch_compile': False,
  'published': {'tflops_per_gpu': 185.0, 'tokens_per_s_per_gpu': 2262.0, 'mfu': 0.5957, 'step_s': None},
  'notes': "section 'A100 80GB with 1600 Gbps node-node interconnect (RoCE)'. PyTorch FSDP FULL_SHARD (FULL_SHARD = "
           "ZeRO-3-like, SHARD_GRAD_OP = ZeRO-2-like), precision amp_bf16 / MP mode DEFAULT ('amp_bf16 DEFAULT' = "
           "autocast bf16 with fp32 master weights; 'bf16 PURE' = FSDP mixed precision with params/reduce/buffers in "
           'bf16); GradAccum 3; global_batch = MicroBatchSize*GradAccum*gpus = 48 sequences; HFU 59.57%; samples/s 8, '
           'tokens/s 18097; NumParams 12853954560. Activation checkpointing False (FSDP per-block checkpointing -> '
           "'full'). Columns: MFU | HFU | Model TFLOP | MicroBatchSize | GradAccum | GlobalBatchSize | Throughput "
           '(S/s) | (T/s) | (T/s/GPU) | ... | Precision | MP Mode | Sharding Strategy | Activation Checkpointing | ... '
           '| NumParams. Convention (README + collect_results.py): flops_per_seq = 2*n_params*seq, attn_flops_per_seq '
           '= n_layers*2*2*d_model*seq^2 (full, non-causal); Model TFLOP = (3*flops_per_seq + 3*attn_flops_per_seq) * '
           "samples/s / gpus; MFU against composer's GPU_AVAILABLE_FLOPS for the precision (h100-sxm / a100; "
           'MFU/Model-TFLOP ratios imply ~989 and ~312 TFLOP/s); HFU uses 4x instead of 3x when activation '
           'checkpointing is on. FLOPs exclude norms/activations/residuals. n_params includes the learned position '
           "embedding (NumParams varies with seq). Tables predate the torch-2.0 update ('TODO: Update tables with "
           "torch 2.0') -> torch_compile False. MPT architecture from scripts/train/yamls/pretrain/mpt-<size>.yaml at "
           'the fetched HEAD (d_model, n_heads, n_layers, expansion_ratio 4, vocab 50368, flash attention); MPTConfig '
           'defaults learned_pos_emb=True, tie_word_embeddings=True; GELU MLP (no gate). The yamls may have changed '
           'since the tables were produced (the 3b/1b yamls note heads modified for FlashAttention head dim 128); '
           'NumParams in the row is the authoritative size.'},
 {'id': 'mpt-7b-s2048-8gpu-a100-80gb',
  'source': 'mosaicml/llm-foundry scripts/train/benchmarking/README.md, A100 80GB with 1600 Gbps node-node '
            'interconnect (RoCE)',
  'source_kind': 'repo',
  'quote': '|  7b | 2048 | 8 | a100_80gb | 64.23 | 64.23 | 200 | 6 | 2 | 96 | 18 | 37130 | 4641 | 196608 | amp_bf16 | '
           'DEFAULT | FULL_SHARD | False | False | 6658859008 |',
  'model': {'family': 'mpt',
            'layers': 32,
            'hidden': 4096,
            'heads': 32,
            'kv_heads': None,
            'ffn': 16384,
            'vocab': 50368,
            'seq': 2048,
            'params_b': 6.659,
            'hf_config': 'MptConfig',
            'tied_embeddings': True},
  'hardware': 'a100-80gb',
  'gpus': 8,
  'mesh': {'tp': 1, 'pp': 1, 'dp': 8, 'cp': 1, 'ep': 1, 'vp': 1},
  'fsdp': 'fsdp',
  'sequence_parallel': False,
  'schedule': None,
  'micro_batch': 6,
  'global_batch': 96,
  'recompute': 'none',
  'precision': 'bf16',
  'torch_compile': False,
  'published': {'tflops_per_gpu': 200.0, 'tokens_per_s_per_gpu': 4641.0, 'mfu': 0.6423, 'step_s': None},
  'notes': "section 'A100 80GB with 1600 Gbps node-node interconnect (RoCE)'. PyTorch FSDP FULL_SHARD (FULL_SHARD = "
           "ZeRO-3-like, SHARD_GRAD_OP = ZeRO-2-like), precision amp_bf16 / MP mode DEFAULT ('amp_bf16 DEFAULT' = "
           "autocast bf16 with fp32 master weights; 'bf16 PURE' = FSDP mixed precision with params/reduce/buffers in "
           'bf16); GradAccum 2; global_batch = MicroBatchSize*GradAccum*gpus = 96 sequences; HFU 64.23%; samples/s 18, '
           'tokens/s 37130; NumParams 6658859008. Activation checkpointing False (FSDP per-block checkpointing -> '
           "'full'). Columns: MFU | HFU | Model TFLOP | MicroBatchSize | GradAccum | GlobalBatchSize | Throughput "
           '(S/s) | (T/s) | (T/s/GPU) | ... | Precision | MP Mode | Sharding Strategy | Activation Checkpointing | ... '
           '| NumParams. Convention (README + collect_results.py): flops_per_seq = 2*n_params*seq, attn_flops_per_seq '
           '= n_layers*2*2*d_model*seq^2 (full, non-causal); Model TFLOP = (3*flops_per_seq + 3*attn_flops_per_seq) * '
           "samples/s / gpus; MFU against composer's GPU_AVAILABLE_FLOPS for the precision (h100-sxm / a100; "
           'MFU/Model-TFLOP ratios imply ~989 and ~312 TFLOP/s); HFU uses 4x instead of 3x when activation '
           'checkpointing is on. FLOPs exclude norms/activations/residuals. n_params includes the learned position '
           "embedding (NumParams varies with seq). Tables predate the torch-2.0 update ('TODO: Update tables with "
           "torch 2.0') -> torch_compile False. MPT architecture from scripts/train/yamls/pretrain/mpt-<size>.yaml at "
           'the fetched HEAD (d_model, n_heads, n_layers, expansion_ratio 4, vocab 50368, flash attention); MPTConfig '
           'defaults learned_pos_emb=True, tie_word_embeddings=True; GELU MLP (no gate). The yamls may have changed '
           'since the tables were produced (the 3b/1b yamls note heads modified for FlashAttention head dim 128); '
           'NumParams in the row is the authoritative size.'},
 {'id': 'mpt-7b-s8192-8gpu-a100-80gb',
  'source': 'mosaicml/llm-foundry scripts/train/benchmarking/README.md, A100 80GB with 1600 Gbps node-node '
            'interconnect (RoCE)',
  'source_kind': 'repo',
  'quote': '|  7b | 8192 | 8 | a100_80gb | 54.47 | 72.62 | 169 | 8 | 2 | 128 | 3 | 25655 | 3206 | 1048576 | amp_bf16 | '
           'DEFAULT | FULL_SHARD | True | False | 6684024832 |',
  'model': {'family': 'mpt',
            'layers': 32,
            'hidden': 4096,
            'heads': 32,
            'kv_heads': None,
            'ffn': 16384,
            'vocab': 50368,
            'seq': 8192,
            'params_b': 6.684,
            'hf_config': 'MptConfig',
            'tied_embeddings': True},
  'hardware': 'a100-80gb',
  'gpus': 8,
  'mesh': {'tp': 1, 'pp': 1, 'dp': 8, 'cp': 1, 'ep': 1, 'vp': 1},
  'fsdp': 'fsdp',
  'sequence_parallel': False,
  'schedule': None,
  'micro_batch': 8,
  'global_batch': 128,
  'recompute': 'full',
  'precision': 'bf16',
  'torch_compile': False,
  'published': {'tflops_per_gpu': 169.0, 'tokens_per_s_per_gpu': 3206.0, 'mfu': 0.5447, 'step_s': None},
  'notes': "section 'A100 80GB with 1600 Gbps node-node interconnect (RoCE)'. PyTorch FSDP FULL_SHARD (FULL_SHARD = "
           "ZeRO-3-like, SHARD_GRAD_OP = ZeRO-2-like), precision amp_bf16 / MP mode DEFAULT ('amp_bf16 DEFAULT' = "
           "autocast bf16 with fp32 master weights; 'bf16 PURE' = FSDP mixed precision with params/reduce/buffers in "
           'bf16); GradAccum 2; global_batch = MicroBatchSize*GradAccum*gpus = 128 sequences; HFU 72.62%; samples/s 3, '
           'tokens/s 25655; NumParams 6684024832. Activation checkpointing True (FSDP per-block checkpointing -> '
           "'full'). Columns: MFU | HFU | Model TFLOP | MicroBatchSize | GradAccum | GlobalBatchSize | Throughput "
           '(S/s) | (T/s) | (T/s/GPU) | ... | Precision | MP Mode | Sharding Strategy | Activation Checkpointing | ... '
           '| NumParams. Convention (README + collect_results.py): flops_per_seq = 2*n_params*seq, attn_flops_per_seq '
           '= n_layers*2*2*d_model*seq^2 (full, non-causal); Model TFLOP = (3*flops_per_seq + 3*attn_flops_per_seq) * '
           "samples/s / gpus; MFU against composer's GPU_AVAILABLE_FLOPS for the precision (h100-sxm / a100; "
           'MFU/Model-TFLOP ratios imply ~989 and ~312 TFLOP/s); HFU uses 4x instead of 3x when activation '
           'checkpointing is on. FLOPs exclude norms/activations/residuals. n_params includes the learned position '
           "embedding (NumParams varies with seq). Tables predate the torch-2.0 update ('TODO: Update tables with "
           "torch 2.0') -> torch_compile False. MPT architecture from scripts/train/yamls/pretrain/mpt-<size>.yaml at "
           'the fetched HEAD (d_model, n_heads, n_layers, expansion_ratio 4, vocab 50368, flash attention); MPTConfig '
           'defaults learned_pos_emb=True, tie_word_embeddings=True; GELU MLP (no gate). The yamls may have changed '
           'since the tables were produced (the 3b/1b yamls note heads modified for FlashAttention head dim 128); '
           'NumParams in the row is the authoritative size.'},
 {'id': 'mpt-70b-s2048-128gpu-a100-40gb',
  'source': 'mosaicml/llm-foundry scripts/train/benchmarking/README.md, A100 40GB with 1600 Gbps node-node '
            'interconnect (RoCE)',
  'source_kind': 'repo',
  'quote': '|  70b | 2048 | 128 | a100_40gb | 48.91 | 65.21 | 152 | 4 | 1 | 512 | 23 | 48194 | 376 | 1048576 | bf16 | '
           'PURE | FULL_SHARD | True | False | 64862437376 |',
  'model': {'family': 'mpt',
            'layers': 80,
            'hidden': 8192,
            'heads': 64,
            'kv_heads': None,
            'ffn': 32768,
            'vocab': 50368,
            'seq': 2048,
            'params_b': 64.862,
            'hf_config': 'MptConfig',
            'tied_embeddings': True},
  'hardware': 'a100-40gb',
  'gpus': 128,
  'mesh': {'tp': 1, 'pp': 1, 'dp': 128, 'cp': 1, 'ep': 1, 'vp': 1},
  'fsdp': 'fsdp',
  'sequence_parallel': False,
  'schedule': None,
  'micro_batch': 4,
  'global_batch': 512,
  'recompute': 'full',
  'precision': 'bf16',
  'torch_compile': False,
  'published': {'tflops_per_gpu': 152.0, 'tokens_per_s_per_gpu': 376.0, 'mfu': 0.4891, 'step_s': None},
  'notes': "section 'A100 40GB with 1600 Gbps node-node interconnect (RoCE)'. PyTorch FSDP FULL_SHARD (FULL_SHARD = "
           "ZeRO-3-like, SHARD_GRAD_OP = ZeRO-2-like), precision bf16 / MP mode PURE ('amp_bf16 DEFAULT' = autocast "
           "bf16 with fp32 master weights; 'bf16 PURE' = FSDP mixed precision with params/reduce/buffers in bf16); "
           'GradAccum 1; global_batch = MicroBatchSize*GradAccum*gpus = 512 sequences; HFU 65.21%; samples/s 23, '
           'tokens/s 48194; NumParams 64862437376. Activation checkpointing True (FSDP per-block checkpointing -> '
           "'full'). Columns: MFU | HFU | Model TFLOP | MicroBatchSize | GradAccum | GlobalBatchSize | Throughput "
           '(S/s) | (T/s) | (T/s/GPU) | ... | Precision | MP Mode | Sharding Strategy | Activation Checkpointing | ... '
           '| NumParams. Convention (README + collect_results.py): flops_per_seq = 2*n_params*seq, attn_flops_per_seq '
           '= n_layers*2*2*d_model*seq^2 (full, non-causal); Model TFLOP = (3*flops_per_seq + 3*attn_flops_per_seq) * '
           "samples/s / gpus; MFU against composer's GPU_AVAILABLE_FLOPS for the precision (h100-sxm / a100; "
           'MFU/Model-TFLOP ratios imply ~989 and ~312 TFLOP/s); HFU uses 4x instead of 3x when activation '
           'checkpointing is on. FLOPs exclude norms/activations/residuals. n_params includes the learned position '
           "embedding (NumParams varies with seq). Tables predate the torch-2.0 update ('TODO: Update tables with "
           "torch 2.0') -> torch_compile False. MPT architecture from scripts/train/yamls/pretrain/mpt-<size>.yaml at "
           'the fetched HEAD (d_model, n_heads, n_layers, expansion_ratio 4, vocab 50368, flash attention); MPTConfig '
           'defaults learned_pos_emb=True, tie_word_embeddings=True; GELU MLP (no gate). The yamls may have changed '
           'since the tables were produced (the 3b/1b yamls note heads modified for FlashAttention head dim 128); '
           'NumParams in the row is the authoritative size.'},
 {'id': 'mpt-30b-s2048-128gpu-a100-40gb',
  'source': 'mosaicml/llm-foundry scripts/train/benchmarking/README.md, A100 40GB with 1600 Gbps node-node '
            'interconnect (RoCE)',
  'source_kind': 'repo',
  'quote': '|  30b | 2048 | 128 | a100_40gb | 52.25 | 69.66 | 163 | 6 | 1 | 768 | 54 | 110803 | 865 | 1572864 | bf16 | '
           'PURE | FULL_SHARD | True | False | 29975214080 |',
  'model': {'family': 'mpt',
            'layers': 48,
            'hidden': 7168,
            'heads': 56,
            'kv_heads': None,
            'ffn': 28672,
            'vocab': 50368,
            'seq': 2048,
            'params_b': 29.975,
            'hf_config': 'MptConfig',
            'tied_embeddings': True},
  'hardware': 'a100-40gb',
  'gpus': 128,
  'mesh': {'tp': 1, 'pp': 1, 'dp': 128, 'cp': 1, 'ep': 1, 'vp': 1},
  'fsdp': 'fsdp',
  'sequence_parallel': False,
  'schedule': None,
  'micro_batch': 6,
  'global_batch': 768,
  'recompute': 'full',
  'precision': 'bf16',
  'torch_compile': False,
  'published': {'tflops_per_gpu': 163.0, 'tokens_per_s_per_gpu': 865.0, 'mfu': 0.5225, 'step_s': None},
  'notes': "section 'A100 40GB with 1600 Gbps node-node interconnect (RoCE)'. PyTorch FSDP FULL_SHARD (FULL_SHARD = "
           "ZeRO-3-like, SHARD_GRAD_OP = ZeRO-2-like), precision bf16 / MP mode PURE ('amp_bf16 DEFAULT' = autocast "
           "bf16 with fp32 master weights; 'bf16 PURE' = FSDP mixed precision with params/reduce/buffers in bf16); "
           'GradAccum 1; global_batch = MicroBatchSize*GradAccum*gpus = 768 sequences; HFU 69.66%; samples/s 54, '
           'tokens/s 110803; NumParams 29975214080. Activation checkpointing True (FSDP per-block checkpointing -> '
           "'full'). Columns: MFU | HFU | Model TFLOP | MicroBatchSize | GradAccum | GlobalBatchSize | Throughput "
           '(S/s) | (T/s) | (T/s/GPU) | ... | Precision | MP Mode | Sharding Strategy | Activation Checkpointing | ... '
           '| NumParams. Convention (README + collect_results.py): flops_per_seq = 2*n_params*seq, attn_flops_per_seq '
           '= n_layers*2*2*d_model*seq^2 (full, non-causal); Model TFLOP = (3*flops_per_seq + 3*attn_flops_per_seq) * '
           "samples/s / gpus; MFU against composer's GPU_AVAILABLE_FLOPS for the precision (h100-sxm / a100; "
           'MFU/Model-TFLOP ratios imply ~989 and ~312 TFLOP/s); HFU uses 4x instead of 3x when activation '
           'checkpointing is on. FLOPs exclude norms/activations/residuals. n_params includes the learned position '
           "embedding (NumParams varies with seq). Tables predate the torch-2.0 update ('TODO: Update tables with "
           "torch 2.0') -> torch_compile False. MPT architecture from scripts/train/yamls/pretrain/mpt-<size>.yaml at "
           'the fetched HEAD (d_model, n_heads, n_layers, expansion_ratio 4, vocab 50368, flash attention); MPTConfig '
           'defaults learned_pos_emb=True, tie_word_embeddings=True; GELU MLP (no gate). The yamls may have changed '
           'since the tables were produced (the 3b/1b yamls note heads modified for FlashAttention head dim 128); '
           'NumParams in the row is the authoritative size.'},
 {'id': 'mpt-13b-s2048-128gpu-a100-40gb',
  'source': 'mosaicml/llm-foundry scripts/train/benchmarking/README.md, A100 40GB with 1600 Gbps node-node '
            'interconnect (RoCE)',
  'source_kind': 'repo',
  'quote': '|  13b | 2048 | 128 | a100_40gb | 51.93 | 69.24 | 162 | 16 | 1 | 2048 | 123 | 252444 | 1972 | 4194304 | '
           'bf16 | PURE | FULL_SHARD | True | False | 12853954560 |',
  'model': {'family': 'mpt',
            'layers': 40,
            'hidden': 5120,
            'heads': 40,
            'kv_heads': None,
            'ffn': 20480,
            'vocab': 50368,
            'seq': 2048,
            'params_b': 12.854,
            'hf_config': 'MptConfig',
            'tied_embeddings': True},
  'hardware': 'a100-40gb',
  'gpus': 128,
  'mesh': {'tp': 1, 'pp': 1, 'dp': 128, 'cp': 1, 'ep': 1, 'vp': 1},
  'fsdp': 'fsdp',
  'sequence_parallel': False,
  'schedule': None,
  'micro_batch': 16,
  'global_batch': 2048,
  'recompute': 'full',
  'precision': 'bf16',
  'torch_compile': False,
  'published': {'tflops_per_gpu': 162.0, 'tokens_per_s_per_gpu': 1972.0, 'mfu': 0.5193, 'step_s': None},
  'notes': "section 'A100 40GB with 1600 Gbps node-node interconnect (RoCE)'. PyTorch FSDP FULL_SHARD (FULL_SHARD = "
           "ZeRO-3-like, SHARD_GRAD_OP = ZeRO-2-like), precision bf16 / MP mode PURE ('amp_bf16 DEFAULT' = autocast "
           "bf16 with fp32 master weights; 'bf16 PURE' = FSDP mixed precision with params/reduce/buffers in bf16); "
           'GradAccum 1; global_batch = MicroBatchSize*GradAccum*gpus = 2048 sequences; HFU 69.24%; samples/s 123, '
           'tokens/s 252444; NumParams 12853954560. Activation checkpointing True (FSDP per-block checkpointing -> '
           "'full'). Columns: MFU | HFU | Model TFLOP | MicroBatchSize | GradAccum | GlobalBatchSize | Throughput "
           '(S/s) | (T/s) | (T/s/GPU) | ... | Precision | MP Mode | Sharding Strategy | Activation Checkpointing | ... '
           '| NumParams. Convention (README + collect_results.py): flops_per_seq = 2*n_params*seq, attn_flops_per_seq '
           '= n_layers*2*2*d_model*seq^2 (full, non-causal); Model TFLOP = (3*flops_per_seq + 3*attn_flops_per_seq) * '
           "samples/s / gpus; MFU against composer's GPU_AVAILABLE_FLOPS for the precision (h100-sxm / a100; "
           'MFU/Model-TFLOP ratios imply ~989 and ~312 TFLOP/s); HFU uses 4x instead of 3x when activation '
           'checkpointing is on. FLOPs exclude norms/activations/residuals. n_params includes the learned position '
           "embedding (NumParams varies with seq). Tables predate the torch-2.0 update ('TODO: Update tables with "
           "torch 2.0') -> torch_compile False. MPT architecture from scripts/train/yamls/pretrain/mpt-<size>.yaml at "
           'the fetched HEAD (d_model, n_heads, n_layers, expansion_ratio 4, vocab 50368, flash attention); MPTConfig '
           'defaults learned_pos_emb=True, tie_word_embeddings=True; GELU MLP (no gate). The yamls may have changed '
           'since the tables were produced (the 3b/1b yamls note heads modified for FlashAttention head dim 128); '
           'NumParams in the row is the authoritative size.'},
 {'id': 'mpt-7b-s2048-128gpu-a100-40gb',
  'source': 'mosaicml/llm-foundry scripts/train/benchmarking/README.md, A100 40GB with 1600 Gbps node-node '
            'interconnect (RoCE)',
  'source_kind': 'repo',
  'quote': '|  7b | 2048 | 128 | a100_40gb | 50.14 | 66.85 | 156 | 18 | 1 | 2304 | 226 | 463749 | 3623 | 4718592 | '
           'bf16 | PURE | FULL_SHARD | True | False | 6658859008 |',
  'model': {'family': 'mpt',
            'layers': 32,
            'hidden': 4096,
            'heads': 32,
            'kv_heads': None,
            'ffn': 16384,
            'vocab': 50368,
            'seq': 2048,
            'params_b': 6.659,
            'hf_config': 'MptConfig',
            'tied_embeddings': True},
  'hardware': 'a100-40gb',
  'gpus': 128,
  'mesh': {'tp': 1, 'pp': 1, 'dp': 128, 'cp': 1, 'ep': 1, 'vp': 1},
  'fsdp': 'fsdp',
  'sequence_parallel': False,
  'schedule': None,
  'micro_batch': 18,
  'global_batch': 2304,
  'recompute': 'full',
  'precision': 'bf16',
  'torch_compile': False,
  'published': {'tflops_per_gpu': 156.0, 'tokens_per_s_per_gpu': 3623.0, 'mfu': 0.5014, 'step_s': None},
  'notes': "section 'A100 40GB with 1600 Gbps node-node interconnect (RoCE)'. PyTorch FSDP FULL_SHARD (FULL_SHARD = "
           "ZeRO-3-like, SHARD_GRAD_OP = ZeRO-2-like), precision bf16 / MP mode PURE ('amp_bf16 DEFAULT' = autocast "
           "bf16 with fp32 master weights; 'bf16 PURE' = FSDP mixed precision with params/reduce/buffers in bf16); "
           'GradAccum 1; global_batch = MicroBatchSize*GradAccum*gpus = 2304 sequences; HFU 66.85%; samples/s 226, '
           'tokens/s 463749; NumParams 6658859008. Activation checkpointing True (FSDP per-block checkpointing -> '
           "'full'). Columns: MFU | HFU | Model TFLOP | MicroBatchSize | GradAccum | GlobalBatchSize | Throughput "
           '(S/s) | (T/s) | (T/s/GPU) | ... | Precision | MP Mode | Sharding Strategy | Activation Checkpointing | ... '
           '| NumParams. Convention (README + collect_results.py): flops_per_seq = 2*n_params*seq, attn_flops_per_seq '
           '= n_layers*2*2*d_model*seq^2 (full, non-causal); Model TFLOP = (3*flops_per_seq + 3*attn_flops_per_seq) * '
           "samples/s / gpus; MFU against composer's GPU_AVAILABLE_FLOPS for the precision (h100-sxm / a100; "
           'MFU/Model-TFLOP ratios imply ~989 and ~312 TFLOP/s); HFU uses 4x instead of 3x when activation '
           'checkpointing is on. FLOPs exclude norms/activations/residuals. n_params includes the learned position '
           "embedding (NumParams varies with seq). Tables predate the torch-2.0 update ('TODO: Update tables with "
           "torch 2.0') -> torch_compile False. MPT architecture from scripts/train/yamls/pretrain/mpt-<size>.yaml at "
           'the fetched HEAD (d_model, n_heads, n_layers, expansion_ratio 4, vocab 50368, flash attention); MPTConfig '
           'defaults learned_pos_emb=True, tie_word_embeddings=True; GELU MLP (no gate). The yamls may have changed '
           'since the tables were produced (the 3b/1b yamls note heads modified for FlashAttention head dim 128); '
           'NumParams in the row is the authoritative size.'},
 {'id': 'mpt-7b-s2048-8gpu-a100-40gb',
  'source': 'mosaicml/llm-foundry scripts/train/benchmarking/README.md, A100 40GB with 1600 Gbps node-node '
            'interconnect (RoCE)',
  'source_kind': 'repo',
  'quote': '|  7b | 2048 | 8 | a100_40gb | 50.92 | 67.89 | 158 | 12 | 4 | 384 | 14 | 29436 | 3679 | 786432 | bf16 | '
           'PURE | FULL_SHARD | True | False | 6658859008 |',
  'model': {'family': 'mpt',
            'layers': 32,
            'hidden': 4096,
            'heads': 32,
            'kv_heads': None,
            'ffn': 16384,
            'vocab': 50368,
            'seq': 2048,
            'params_b': 6.659,
            'hf_config': 'MptConfig',
            'tied_embeddings': True},
  'hardware': 'a100-40gb',
  'gpus': 8,
  'mesh': {'tp': 1, 'pp': 1, 'dp': 8, 'cp': 1, 'ep': 1, 'vp': 1},
  'fsdp': 'fsdp',
  'sequence_parallel': False,
  'schedule': None,
  'micro_batch': 12,
  'global_batch': 384,
  'recompute': 'full',
  'precision': 'bf16',
  'torch_compile': False,
  'published': {'tflops_per_gpu': 158.0, 'tokens_per_s_per_gpu': 3679.0, 'mfu': 0.5092, 'step_s': None},
  'notes': "section 'A100 40GB with 1600 Gbps node-node interconnect (RoCE)'. PyTorch FSDP FULL_SHARD (FULL_SHARD = "
           "ZeRO-3-like, SHARD_GRAD_OP = ZeRO-2-like), precision bf16 / MP mode PURE ('amp_bf16 DEFAULT' = autocast "
           "bf16 with fp32 master weights; 'bf16 PURE' = FSDP mixed precision with params/reduce/buffers in bf16); "
           'GradAccum 4; global_batch = MicroBatchSize*GradAccum*gpus = 384 sequences; HFU 67.89%; samples/s 14, '
           'tokens/s 29436; NumParams 6658859008. Activation checkpointing True (FSDP per-block checkpointing -> '
           "'full'). Columns: MFU | HFU | Model TFLOP | MicroBatchSize | GradAccum | GlobalBatchSize | Throughput "
           '(S/s) | (T/s) | (T/s/GPU) | ... | Precision | MP Mode | Sharding Strategy | Activation Checkpointing | ... '
           '| NumParams. Convention (README + collect_results.py): flops_per_seq = 2*n_params*seq, attn_flops_per_seq '
           '= n_layers*2*2*d_model*seq^2 (full, non-causal); Model TFLOP = (3*flops_per_seq + 3*attn_flops_per_seq) * '
           "samples/s / gpus; MFU against composer's GPU_AVAILABLE_FLOPS for the precision (h100-sxm / a100; "
           'MFU/Model-TFLOP ratios imply ~989 and ~312 TFLOP/s); HFU uses 4x instead of 3x when activation '
           'checkpointing is on. FLOPs exclude norms/activations/residuals. n_params includes the learned position '
           "embedding (NumParams varies with seq). Tables predate the torch-2.0 update ('TODO: Update tables with "
           "torch 2.0') -> torch_compile False. MPT architecture from scripts/train/yamls/pretrain/mpt-<size>.yaml at "
           'the fetched HEAD (d_model, n_heads, n_layers, expansion_ratio 4, vocab 50368, flash attention); MPTConfig '
           'defaults learned_pos_emb=True, tie_word_embeddings=True; GELU MLP (no gate). The yamls may have changed '
           'since the tables were produced (the 3b/1b yamls note heads modified for FlashAttention head dim 128); '
           'NumParams in the row is the authoritative size.'},
 {'id': 'megatron-bridge-2604p1-gptoss120b-h100-pp4-ep8',
  'source': "NVIDIA-NeMo/Megatron-Bridge docs/performance-summary-archive.md, '26.04.01 NeMo Container', Pre-Training, "
            'GPT OSS 120B',
  'source_kind': 'docs',
  'quote': '| DGX-H100 | 64 | BF16 | 1280 | 1 | 4096 | 0 | 1 | 4 | 1 | n/a | 8 | 5824 | 158 |',
  'model': {'family': 'gpt_oss',
            'layers': 36,
            'hidden': 2880,
            'heads': 64,
            'kv_heads': 8,
            'ffn': 2880,
            'vocab': 201088,
            'seq': 4096,
            'params_b': 120.0,
            'hf_config': 'GptOssConfig',
            'tied_embeddings': False},
  'hardware': 'h100',
  'gpus': 64,
  'mesh': {'tp': 1, 'pp': 4, 'dp': 16, 'cp': 1, 'ep': 8, 'vp': 1},
  'fsdp': None,
  'sequence_parallel': False,
  'schedule': '1f1b',
  'micro_batch': 1,
  'global_batch': 1280,
  'recompute': 'selective',
  'precision': 'bf16',
  'torch_compile': None,
  'published': {'tflops_per_gpu': 158.0, 'tokens_per_s_per_gpu': 5824.0, 'mfu': None, 'step_s': None},
  'notes': 'DGX-H100 x64, seq 4096, VP n/a. dp = gpus/(tp*pp*cp) = 16 (derived); experts sharded EP=8 inside the '
           'data-parallel group. Schedule: pp>1 without virtual stages -> non-interleaved 1F1B (Megatron default; not '
           'stated in the table). Recipe at the fetched HEAD '
           '(src/megatron/bridge/perf_recipes/gpt_oss/h100/gpt_oss.py) gpt_oss_120b_pretrain_64gpu_h100_bf16_config: '
           "TP1 PP4 EP8, sequence_parallel False, GBS 1280, MBS 1, recompute_granularity 'selective' with "
           "recompute_modules ['layernorm', 'moe_act']; the recipe may differ from the one used for this container's "
           'run. The H100 BF16 row of the 25.11 table (GBS 512, MBS 4, PP 4, GA 2) was left out: its GA does not match '
           '512/(4*16). GPT-OSS 120B (Megatron-Bridge docs/models/gpt_oss/gpt-oss.md): 36 decoder layers, 128 routed '
           'experts per layer with top-4 routing, hidden 2880, expert FFN hidden 2880 (gated, QuickGELU-style with '
           'clamp), 64 query heads, 8 KV groups, kv channels 64 (so attention width 4096 != hidden), vocab 201,088, '
           'sliding window 128 alternating with full attention, learnable softmax sinks, biases; transformers '
           "GptOssConfig defaults (v5.24 in .venv) have the same numbers and tie_word_embeddings=False. 'In MoE "
           'training benchmarks, we force-balance the token distribution among experts and all benchmarks are '
           "token-dropless.' Metrics: 'Tokens/sec/GPU' and 'Model TFLOP/sec/GPU' (model FLOPs from Megatron-Bridge's "
           'training/utils/flop_utils.py; the current version accounts for causal masking and sliding windows -- not '
           're-derived here). FSDP column 0 = DDP; whether the distributed optimizer was on is not stated -> fsdp '
           'None.'},
 {'id': 'megatron-bridge-2604p1-gptoss120b-b200-ep8',
  'source': "NVIDIA-NeMo/Megatron-Bridge docs/performance-summary-archive.md, '26.04.01 NeMo Container', Pre-Training, "
            'GPT OSS 120B',
  'source_kind': 'docs',
  'quote': '| DGX-B200 | 64 | BF16 | 1280 | 4 | 4096 | 0 | 1 | 1 | 1 | n/a | 8 | 13568 | 369 |',
  'model': {'family': 'gpt_oss',
            'layers': 36,
            'hidden': 2880,
            'heads': 64,
            'kv_heads': 8,
            'ffn': 2880,
            'vocab': 201088,
            'seq': 4096,
            'params_b': 120.0,
            'hf_config': 'GptOssConfig',
            'tied_embeddings': False},
  'hardware': 'b200',
  'gpus': 64,
  'mesh': {'tp': 1, 'pp': 1, 'dp': 64, 'cp': 1, 'ep': 8, 'vp': 1},
  'fsdp': None,
  'sequence_parallel': False,
  'schedule': None,
  'micro_batch': 4,
  'global_batch': 1280,
  'recompute': 'selective',
  'precision': 'bf16',
  'torch_compile': None,
  'published': {'tflops_per_gpu': 369.0, 'tokens_per_s_per_gpu': 13568.0, 'mfu': None, 'step_s': None},
  'notes': 'DGX-B200 x64, seq 4096, VP n/a. dp = gpus/(tp*pp*cp) = 64 (derived); experts sharded EP=8 inside the '
           'data-parallel group. Schedule: pp>1 without virtual stages -> non-interleaved 1F1B (Megatron default; not '
           'stated in the table). Recipe at the fetched HEAD '
           '(src/megatron/bridge/perf_recipes/gpt_oss/b200/gpt_oss.py) gpt_oss_120b_pretrain_64gpu_b200_bf16_config: '
           "TP1 PP1 EP8, sequence_parallel False, GBS 1280, MBS 4, recompute_granularity 'selective' with "
           "recompute_modules ['layernorm', 'moe_act']; the recipe may differ from the one used for this container's "
           'run. The H100 BF16 row of the 25.11 table (GBS 512, MBS 4, PP 4, GA 2) was left out: its GA does not match '
           '512/(4*16). GPT-OSS 120B (Megatron-Bridge docs/models/gpt_oss/gpt-oss.md): 36 decoder layers, 128 routed '
           'experts per layer with top-4 routing, hidden 2880, expert FFN hidden 2880 (gated, QuickGELU-style with '
           'clamp), 64 query heads, 8 KV groups, kv channels 64 (so attention width 4096 != hidden), vocab 201,088, '
           'sliding window 128 alternating with full attention, learnable softmax sinks, biases; transformers '
           "GptOssConfig defaults (v5.24 in .venv) have the same numbers and tie_word_embeddings=False. 'In MoE "
           'training benchmarks, we force-balance the token distribution among experts and all benchmarks are '
           "token-dropless.' Metrics: 'Tokens/sec/GPU' and 'Model TFLOP/sec/GPU' (model FLOPs from Megatron-Bridge's "
           'training/utils/flop_utils.py; the current version accounts for causal masking and sliding windows -- not '
           're-derived here). FSDP column 0 = DDP; whether the distributed optimizer was on is not stated -> fsdp '
           'None.'},
 {'id': 'megatron-bridge-2511-gptoss120b-b200-ep8-gbs512',
  'source': "NVIDIA-NeMo/Megatron-Bridge docs/performance-summary-archive.md, '25.11 NeMo Container', Pre-Training, "
            'GPT OSS 120B',
  'source_kind': 'docs',
  'quote': '| GPT OSS 120B | 64 | BF16 | 512 | 4 | 4096 | 0 | 1 | 1 | 1 | 1 | 8 | 2 | 8213 | 223 |',
  'model': {'family': 'gpt_oss',
            'layers': 36,
            'hidden': 2880,
            'heads': 64,
            'kv_heads': 8,
            'ffn': 2880,
            'vocab': 201088,
            'seq': 4096,
            'params_b': 120.0,
            'hf_config': 'GptOssConfig',
            'tied_embeddings': False},
  'hardware': 'b200',
  'gpus': 64,
  'mesh': {'tp': 1, 'pp': 1, 'dp': 64, 'cp': 1, 'ep': 8, 'vp': 1},
  'fsdp': None,
  'sequence_parallel': False,
  'schedule': None,
  'micro_batch': 4,
  'global_batch': 512,
  'recompute': None,
  'precision': 'bf16',
  'torch_compile': None,
  'published': {'tflops_per_gpu': 223.0, 'tokens_per_s_per_gpu': 8213.0, 'mfu': None, 'step_s': None},
  'notes': 'DGX-B200 x64, seq 4096, VP n/a. dp = gpus/(tp*pp*cp) = 64 (derived); experts sharded EP=8 inside the '
           'data-parallel group. Schedule: pp>1 without virtual stages -> non-interleaved 1F1B (Megatron default; not '
           'stated in the table). 25.11 table (System: DGX-B200) lists GA 2 = 512/(4*64); recompute settings for that '
           'container not checked. The H100 BF16 row of the 25.11 table (GBS 512, MBS 4, PP 4, GA 2) was left out: its '
           'GA does not match 512/(4*16). GPT-OSS 120B (Megatron-Bridge docs/models/gpt_oss/gpt-oss.md): 36 decoder '
           'layers, 128 routed experts per layer with top-4 routing, hidden 2880, expert FFN hidden 2880 (gated, '
           'QuickGELU-style with clamp), 64 query heads, 8 KV groups, kv channels 64 (so attention width 4096 != '
           'hidden), vocab 201,088, sliding window 128 alternating with full attention, learnable softmax sinks, '
           'biases; transformers GptOssConfig defaults (v5.24 in .venv) have the same numbers and '
           "tie_word_embeddings=False. 'In MoE training benchmarks, we force-balance the token distribution among "
           "experts and all benchmarks are token-dropless.' Metrics: 'Tokens/sec/GPU' and 'Model TFLOP/sec/GPU' (model "
           "FLOPs from Megatron-Bridge's training/utils/flop_utils.py; the current version accounts for causal masking "
           'and sliding windows -- not re-derived here). FSDP column 0 = DDP; whether the distributed optimizer was on '
           'is not stated -> fsdp None.'},
 {'id': 'bloom-176b-384gpu-a100',
  'source': "bigscience-workshop/bigscience train/tr11-176B-ml/README.md ('Replica setup', 'Throughput', 'Important "
            "checkpoints') + tr11-176B-ml.slurm",
  'source_kind': 'repo',
  'quote': 'iteration   85376/ 115311 | consumed samples:   158692272 | consumed tokens: 325001773056 | elapsed time '
           'per iteration (s) [line break in file] : 104.70 | learning rate: 1.150E-05 | global batch size: 2048 | ... '
           '| samples per second: 19.561 | TFLOPs: 149.77',
  'model': {'family': 'bloom',
            'layers': 70,
            'hidden': 14336,
            'heads': 112,
            'kv_heads': None,
            'ffn': 57344,
            'vocab': 250880,
            'seq': 2048,
            'params_b': 176.0,
            'hf_config': 'BloomConfig',
            'tied_embeddings': True},
  'hardware': 'a100-80gb',
  'gpus': 384,
  'mesh': {'tp': 4, 'pp': 12, 'dp': 8, 'cp': 1, 'ep': 1, 'vp': 1},
  'fsdp': 'zero1',
  'sequence_parallel': False,
  'schedule': '1f1b',
  'micro_batch': 2,
  'global_batch': 2048,
  'recompute': 'full',
  'precision': 'bf16',
  'torch_compile': False,
  'published': {'tflops_per_gpu': 149.77, 'tokens_per_s_per_gpu': None, 'mfu': None, 'step_s': 104.7},
  'notes': "README: 'GPUs = 384 (48 nodes of 8)', 'TP=4 PP=12 DP=8 MBS=2', 'One replica is 48 GPUs'; slurm: "
           'MICRO_BATCH_SIZE=2, GLOBAL_BATCH_SIZE=2048, NHIDDEN=14336, NLAYERS=70, NHEADS=112, SEQ_LEN=2048, '
           '--pad-vocab-size-to 250880 (tokenizer 250,680), --bf16, --position-embedding-type alibi, '
           "--embed-layernorm, --checkpoint-activations, --pp-partition-method 'type:transformer|embedding', "
           "ZERO_STAGE=0 ('bf16 must use z0! it implements its own zero stage 1 equivalent' -> zero1). "
           "Megatron-DeepSpeed (DeepSpeed pipeline engine; schedule not stated -- '1f1b' assumed, no interleaving). "
           "Hardware: A100 80GB, 'NVLink 4 inter-gpu connects, 4 OmniPath links' per node (Omni-Path 100 Gbps per link "
           "per the BLOOM paper summary), NCCL on a dedicated subnet. TFLOP convention (README 'Throughput' + "
           "math/README.md): 'it's the hardware TFLOPs that we calculate - using the 4*2 co-efficient' (includes the "
           'recompute forward) -- model_size*4*2*seq*gbs/(step_s*gpus), refined by Megatron Eq. 3. Derived: '
           'tokens/s/GPU = 19.561*2048/384 = 104.3. ffn = 4h (GeLU MLP); word embeddings tied (BloomConfig default).'},
 {'id': 'opt-175b-992gpu-a100',
  'source': 'Zhang et al. 2022, OPT: Open Pre-trained Transformer Language Models (arXiv:2205.01068v4), Sec. 2.4 + '
            'Table 1; facebookresearch/metaseq projects/OPT/download_opt175b.md',
  'source_kind': 'paper',
  'quote': 'We trained OPT-175B on 992 80GB A100 GPUs, by utilizing Fully Sharded Data Parallel (Artetxe et al., 2021) '
           'with Megatron-LM Tensor Parallelism (Shoeybi et al., 2019). We achieve utilization of up to 147 TFLOP/s '
           'per GPU.',
  'model': {'family': 'opt',
            'layers': 96,
            'hidden': 12288,
            'heads': 96,
            'kv_heads': None,
            'ffn': 49152,
            'vocab': 50272,
            'seq': 2048,
            'params_b': 175.0,
            'hf_config': 'OPTConfig',
            'tied_embeddings': True},
  'hardware': 'a100-80gb',
  'gpus': 992,
  'mesh': {'tp': 8, 'pp': 1, 'dp': 124, 'cp': 1, 'ep': 1, 'vp': 1},
  'fsdp': 'fsdp',
  'sequence_parallel': False,
  'schedule': None,
  'micro_batch': None,
  'global_batch': None,
  'recompute': None,
  'precision': 'fp16',
  'torch_compile': False,
  'published': {'tflops_per_gpu': 147.0, 'tokens_per_s_per_gpu': None, 'mfu': None, 'step_s': None},
  'notes': "'up to' 147 TFLOP/s (peak of the run, counting convention not given). Table 1: 175B = 96 layers, 96 heads, "
           "d_model 12288, batch '2M' tokens (about 1000 sequences of 2048; the exact sequence count is not given -> "
           "global_batch None). 'all models are trained with ReLU activation and a sequence length of 2048'. 'We keep "
           "Adam state in FP32, since we shard it across all hosts, while the model weights remained in FP16' + "
           "dynamic loss scaling -> fp16. TP 8 from metaseq download_opt175b.md: 'we trained OPT-175B on 124 hosts, we "
           "have 124*8 = 992 files ... (8x tensor parallelism)' -> FSDP/data degree 124 (derived). Recompute and micro "
           'batch not stated. vocab 50272 and tied embeddings = transformers OPTConfig defaults; ffn 4h (GPT-3 layout, '
           'Megatron-style); learned positional embeddings.'},
 {'id': 'axonn-t3-zero3-gpt-5b-64gpu-a100',
  'source': "Singh, Singhania, Ranjan, Sating, Bhatele, 'A 4D Hybrid Algorithm to Scale Parallel Training to Thousands "
            "of GPUs' (AxoNN), Table III (the paper's text (Singh et al., AxoNN)), ZeRO-3 column",
  'source_kind': 'paper',
  'quote': '64 GPT-5B 37% 55% 33% 67%',
  'model': {'family': 'gpt',
            'layers': 24,
            'hidden': 4096,
            'heads': 32,
            'kv_heads': None,
            'ffn': 16384,
            'vocab': None,
            'seq': 2048,
            'params_b': 5.0,
            'hf_config': 'GPT2Config',
            'tied_embeddings': None},
  'hardware': 'a100-40gb',
  'gpus': 64,
  'mesh': {'tp': 1, 'pp': 1, 'dp': 64, 'cp': 1, 'ep': 1, 'vp': 1},
  'fsdp': 'zero3',
  'sequence_parallel': False,
  'schedule': None,
  'micro_batch': None,
  'global_batch': 2048,
  'recompute': 'full',
  'precision': 'bf16',
  'torch_compile': None,
  'published': {'tflops_per_gpu': None, 'tokens_per_s_per_gpu': None, 'mfu': 0.55, 'step_s': None},
  'notes': 'ZeRO-3 (DeepSpeed stage 3) column: pure sharded data parallelism, dp = gpus. Perlmutter: 4x A100 40GB per '
           "node, four HPE Slingshot 11 NICs per node at 200 Gb/s each. 'we employ mixed precision (bf16/fp32) for all "
           "our training runs', activation checkpointing on. Batch 4M tokens at seq 2048 -> 2048 sequences (derived). "
           "Metric = 'hardware flop/s utilization': half-precision FLOP/s from Narayanan et al.'s analytical formula "
           '(Megatron Eq. 3, which counts the recompute forward) divided by 312 TFLOP/s per GPU; stored in the mfu '
           'field (derived TFLOP/s = pct*312). Iteration time = mean of the last 5 of 10 batches. Architecture: Table '
           'I (layers, hidden, heads); ffn 4h (GPT-3 style) and vocab are not stated (vocab None). Micro batch not '
           'stated. tied_embeddings unknown (None).'},
 {'id': 'axonn-t3-axonn4d-gpt-5b-64gpu-a100',
  'source': "Singh, Singhania, Ranjan, Sating, Bhatele, 'A 4D Hybrid Algorithm to Scale Parallel Training to Thousands "
            "of GPUs' (AxoNN), Table III (the paper's text (Singh et al., AxoNN)), AxoNN column",
  'source_kind': 'paper',
  'quote': '64 GPT-5B 37% 55% 33% 67%',
  'model': {'family': 'gpt',
            'layers': 24,
            'hidden': 4096,
            'heads': 32,
            'kv_heads': None,
            'ffn': 16384,
            'vocab': None,
            'seq': 2048,
            'params_b': 5.0,
            'hf_config': 'GPT2Config',
            'tied_embeddings': None},
  'hardware': 'a100-40gb',
  'gpus': 64,
  'mesh': {'tp': None, 'pp': 1, 'dp': None, 'cp': 1, 'ep': 1, 'vp': 1},
  'fsdp': None,
  'sequence_parallel': None,
  'schedule': None,
  'micro_batch': None,
  'global_batch': 2048,
  'recompute': 'full',
  'precision': 'bf16',
  'torch_compile': None,
  'published': {'tflops_per_gpu': None, 'tokens_per_s_per_gpu': None, 'mfu': 0.67, 'step_s': None},
  'notes': 'AxoNN column: 4D hybrid = 3D tensor parallelism (Agarwal-style Gx x Gy x Gz grid over each FC layer) x '
           "data parallelism, with the paper's communication optimizations; the grid sizes chosen for these runs are "
           'NOT published (mesh tp/dp None; no pipeline). This is a different tensor-parallel algorithm from Megatron '
           '1D TP, so it checks a cost model only as an upper bar. Other columns of the same row: Megatron-LM 37% (its '
           "TP/PP degrees are not given and 'we had to make slight adjustments to layers and hidden-sizes of the GPT "
           "models ... for Megatron-LM'), DeepSpeed-3D 33%. Perlmutter: 4x A100 40GB per node, four HPE Slingshot 11 "
           "NICs per node at 200 Gb/s each. 'we employ mixed precision (bf16/fp32) for all our training runs', "
           "activation checkpointing on. Batch 4M tokens at seq 2048 -> 2048 sequences (derived). Metric = 'hardware "
           "flop/s utilization': half-precision FLOP/s from Narayanan et al.'s analytical formula (Megatron Eq. 3, "
           'which counts the recompute forward) divided by 312 TFLOP/s per GPU; stored in the mfu field (derived '
           'TFLOP/s = pct*312). Iteration time = mean of the last 5 of 10 batches. Architecture: Table I (layers, '
           'hidden, heads); ffn 4h (GPT-3 style) and vocab are not stated (vocab None). Micro batch not stated. '
           'tied_embeddings unknown (None).'},
 {'id': 'axonn-t3-zero3-gpt-10b-128gpu-a100',
  'source': "Singh, Singhania, Ranjan, Sating, Bhatele, 'A 4D Hybrid Algorithm to Scale Parallel Training to Thousands "
            "of GPUs' (AxoNN), Table III (the paper's text (Singh et al., AxoNN)), ZeRO-3 column",
  'source_kind': 'paper',
  'quote': '128 GPT-10B 42% 57% 33% 63%',
  'model': {'family': 'gpt',
            'layers': 32,
            'hidden': 5120,
            'heads': 40,
            'kv_heads': None,
            'ffn': 20480,
            'vocab': None,
            'seq': 2048,
            'params_b': 10.0,
            'hf_config': 'GPT2Config',
            'tied_embeddings': None},
  'hardware': 'a100-40gb',
  'gpus': 128,
  'mesh': {'tp': 1, 'pp': 1, 'dp': 128, 'cp': 1, 'ep': 1, 'vp': 1},
  'fsdp': 'zero3',
  'sequence_parallel': False,
  'schedule': None,
  'micro_batch': None,
  'global_batch': 2048,
  'recompute': 'full',
  'precision': 'bf16',
  'torch_compile': None,
  'published': {'tflops_per_gpu': None, 'tokens_per_s_per_gpu': None, 'mfu': 0.57, 'step_s': None},
  'notes': 'ZeRO-3 (DeepSpeed stage 3) column: pure sharded data parallelism, dp = gpus. Perlmutter: 4x A100 40GB per '
           "node, four HPE Slingshot 11 NICs per node at 200 Gb/s each. 'we employ mixed precision (bf16/fp32) for all "
           "our training runs', activation checkpointing on. Batch 4M tokens at seq 2048 -> 2048 sequences (derived). "
           "Metric = 'hardware flop/s utilization': half-precision FLOP/s from Narayanan et al.'s analytical formula "
           '(Megatron Eq. 3, which counts the recompute forward) divided by 312 TFLOP/s per GPU; stored in the mfu '
           'field (derived TFLOP/s = pct*312). Iteration time = mean of the last 5 of 10 batches. Architecture: Table '
           'I (layers, hidden, heads); ffn 4h (GPT-3 style) and vocab are not stated (vocab None). Micro batch not '
           'stated. tied_embeddings unknown (None).'},
 {'id': 'axonn-t3-axonn4d-gpt-10b-128gpu-a100',
  'source': "Singh, Singhania, Ranjan, Sating, Bhatele, 'A 4D Hybrid Algorithm to Scale Parallel Training to Thousands "
            "of GPUs' (AxoNN), Table III (the paper's text (Singh et al., AxoNN)), AxoNN column",
  'source_kind': 'paper',
  'quote': '128 GPT-10B 42% 57% 33% 63%',
  'model': {'family': 'gpt',
            'layers': 32,
            'hidden': 5120,
            'heads': 40,
            'kv_heads': None,
            'ffn': 20480,
            'vocab': None,
            'seq': 2048,
            'params_b': 10.0,
            'hf_config': 'GPT2Config',
            'tied_embeddings': None},
  'hardware': 'a100-40gb',
  'gpus': 128,
  'mesh': {'tp': None, 'pp': 1, 'dp': None, 'cp': 1, 'ep': 1, 'vp': 1},
  'fsdp': None,
  'sequence_parallel': None,
  'schedule': None,
  'micro_batch': None,
  'global_batch': 2048,
  'recompute': 'full',
  'precision': 'bf16',
  'torch_compile': None,
  'published': {'tflops_per_gpu': None, 'tokens_per_s_per_gpu': None, 'mfu': 0.63, 'step_s': None},
  'notes': 'AxoNN column: 4D hybrid = 3D tensor parallelism (Agarwal-style Gx x Gy x Gz grid over each FC layer) x '
           "data parallelism, with the paper's communication optimizations; the grid sizes chosen for these runs are "
           'NOT published (mesh tp/dp None; no pipeline). This is a different tensor-parallel algorithm from Megatron '
           '1D TP, so it checks a cost model only as an upper bar. Other columns of the same row: Megatron-LM 42% (its '
           "TP/PP degrees are not given and 'we had to make slight adjustments to layers and hidden-sizes of the GPT "
           "models ... for Megatron-LM'), DeepSpeed-3D 33%. Perlmutter: 4x A100 40GB per node, four HPE Slingshot 11 "
           "NICs per node at 200 Gb/s each. 'we employ mixed precision (bf16/fp32) for all our training runs', "
           "activation checkpointing on. Batch 4M tokens at seq 2048 -> 2048 sequences (derived). Metric = 'hardware "
           "flop/s utilization': half-precision FLOP/s from Narayanan et al.'s analytical formula (Megatron Eq. 3, "
           'which counts the recompute forward) divided by 312 TFLOP/s per GPU; stored in the mfu field (derived '
           'TFLOP/s = pct*312). Iteration time = mean of the last 5 of 10 batches. Architecture: Table I (layers, '
           'hidden, heads); ffn 4h (GPT-3 style) and vocab are not stated (vocab None). Micro batch not stated. '
           'tied_embeddings unknown (None).'},
 {'id': 'axonn-t3-zero3-gpt-20b-256gpu-a100',
  'source': "Singh, Singhania, Ranjan, Sating, Bhatele, 'A 4D Hybrid Algorithm to Scale Parallel Training to Thousands "
            "of GPUs' (AxoNN), Table III (the paper's text (Singh et al., AxoNN)), ZeRO-3 column",
  'source_kind': 'paper',
  'quote': '256 GPT-20B 42% 57% 35% 67%',
  'model': {'family': 'gpt',
            'layers': 32,
            'hidden': 7168,
            'heads': 56,
            'kv_heads': None,
            'ffn': 28672,
            'vocab': None,
            'seq': 2048,
            'params_b': 20.0,
            'hf_config': 'GPT2Config',
            'tied_embeddings': None},
  'hardware': 'a100-40gb',
  'gpus': 256,
  'mesh': {'tp': 1, 'pp': 1, 'dp': 256, 'cp': 1, 'ep': 1, 'vp': 1},
  'fsdp': 'zero3',
  'sequence_parallel': False,
  'schedule': None,
  'micro_batch': None,
  'global_batch': 2048,
  'recompute': 'full',
  'precision': 'bf16',
  'torch_compile': None,
  'published': {'tflops_per_gpu': None, 'tokens_per_s_per_gpu': None, 'mfu': 0.57, 'step_s': None},
  'notes': 'ZeRO-3 (DeepSpeed stage 3) column: pure sharded data parallelism, dp = gpus. Perlmutter: 4x A100 40GB per '
           "node, four HPE Slingshot 11 NICs per node at 200 Gb/s each. 'we employ mixed precision (bf16/fp32) for all "
           "our training runs', activation checkpointing on. Batch 4M tokens at seq 2048 -> 2048 sequences (derived). "
           "Metric = 'hardware flop/s utilization': half-precision FLOP/s from Narayanan et al.'s analytical formula "
           '(Megatron Eq. 3, which counts the recompute forward) divided by 312 TFLOP/s per GPU; stored in the mfu '
           'field (derived TFLOP/s = pct*312). Iteration time = mean of the last 5 of 10 batches. Architecture: Table '
           'I (layers, hidden, heads); ffn 4h (GPT-3 style) and vocab are not stated (vocab None). Micro batch not '
           'stated. tied_embeddings unknown (None).'},
 {'id': 'axonn-t3-axonn4d-gpt-20b-256gpu-a100',
  'source': "Singh, Singhania, Ranjan, Sating, Bhatele, 'A 4D Hybrid Algorithm to Scale Parallel Training to Thousands "
            "of GPUs' (AxoNN), Table III (the paper's text (Singh et al., AxoNN)), AxoNN column",
  'source_kind': 'paper',
  'quote': '256 GPT-20B 42% 57% 35% 67%',
  'model': {'family': 'gpt',
            'layers': 32,
            'hidden': 7168,
            'heads': 56,
            'kv_heads': None,
            'ffn': 28672,
            'vocab': None,
            'seq': 2048,
            'params_b': 20.0,
            'hf_config': 'GPT2Config',
            'tied_embeddings': None},
  'hardware': 'a100-40gb',
  'gpus': 256,
  'mesh': {'tp': None, 'pp': 1, 'dp': None, 'cp': 1, 'ep': 1, 'vp': 1},
  'fsdp': None,
  'sequence_parallel': None,
  'schedule': None,
  'micro_batch': None,
  'global_batch': 2048,
  'recompute': 'full',
  'precision': 'bf16',
  'torch_compile': None,
  'published': {'tflops_per_gpu': None, 'tokens_per_s_per_gpu': None, 'mfu': 0.67, 'step_s': None},
  'notes': 'AxoNN column: 4D hybrid = 3D tensor parallelism (Agarwal-style Gx x Gy x Gz grid over each FC layer) x '
           "data parallelism, with the paper's communication optimizations; the grid sizes chosen for these runs are "
           'NOT published (mesh tp/dp None; no pipeline). This is a different tensor-parallel algorithm from Megatron '
           '1D TP, so it checks a cost model only as an upper bar. Other columns of the same row: Megatron-LM 42% (its '
           "TP/PP degrees are not given and 'we had to make slight adjustments to layers and hidden-sizes of the GPT "
           "models ... for Megatron-LM'), DeepSpeed-3D 35%. Perlmutter: 4x A100 40GB per node, four HPE Slingshot 11 "
           "NICs per node at 200 Gb/s each. 'we employ mixed precision (bf16/fp32) for all our training runs', "
           "activation checkpointing on. Batch 4M tokens at seq 2048 -> 2048 sequences (derived). Metric = 'hardware "
           "flop/s utilization': half-precision FLOP/s from Narayanan et al.'s analytical formula (Megatron Eq. 3, "
           'which counts the recompute forward) divided by 312 TFLOP/s per GPU; stored in the mfu field (derived '
           'TFLOP/s = pct*312). Iteration time = mean of the last 5 of 10 batches. Architecture: Table I (layers, '
           'hidden, heads); ffn 4h (GPT-3 style) and vocab are not stated (vocab None). Micro batch not stated. '
           'tied_embeddings unknown (None).'},
 {'id': 'axonn-t3-zero3-gpt-40b-512gpu-a100',
  'source': "Singh, Singhania, Ranjan, Sating, Bhatele, 'A 4D Hybrid Algorithm to Scale Parallel Training to Thousands "
            "of GPUs' (AxoNN), Table III (the paper's text (Singh et al., AxoNN)), ZeRO-3 column",
  'source_kind': 'paper',
  'quote': '512 GPT-40B 44% 55% 35% 64%',
  'model': {'family': 'gpt',
            'layers': 38,
            'hidden': 9216,
            'heads': 72,
            'kv_heads': None,
            'ffn': 36864,
            'vocab': None,
            'seq': 2048,
            'params_b': 40.0,
            'hf_config': 'GPT2Config',
            'tied_embeddings': None},
  'hardware': 'a100-40gb',
  'gpus': 512,
  'mesh': {'tp': 1, 'pp': 1, 'dp': 512, 'cp': 1, 'ep': 1, 'vp': 1},
  'fsdp': 'zero3',
  'sequence_parallel': False,
  'schedule': None,
  'micro_batch': None,
  'global_batch': 2048,
  'recompute': 'full',
  'precision': 'bf16',
  'torch_compile': None,
  'published': {'tflops_per_gpu': None, 'tokens_per_s_per_gpu': None, 'mfu': 0.55, 'step_s': None},
  'notes': 'ZeRO-3 (DeepSpeed stage 3) column: pure sharded data parallelism, dp = gpus. Perlmutter: 4x A100 40GB per '
           "node, four HPE Slingshot 11 NICs per node at 200 Gb/s each. 'we employ mixed precision (bf16/fp32) for all "
           "our training runs', activation checkpointing on. Batch 4M tokens at seq 2048 -> 2048 sequences (derived). "
           "Metric = 'hardware flop/s utilization': half-precision FLOP/s from Narayanan et al.'s analytical formula "
           '(Megatron Eq. 3, which counts the recompute forward) divided by 312 TFLOP/s per GPU; stored in the mfu '
           'field (derived TFLOP/s = pct*312). Iteration time = mean of the last 5 of 10 batches. Architecture: Table '
           'I (layers, hidden, heads); ffn 4h (GPT-3 style) and vocab are not stated (vocab None). Micro batch not '
           'stated. tied_embeddings unknown (None).'},
 {'id': 'axonn-t3-axonn4d-gpt-40b-512gpu-a100',
  'source': "Singh, Singhania, Ranjan, Sating, Bhatele, 'A 4D Hybrid Algorithm to Scale Parallel Training to Thousands "
            "of GPUs' (AxoNN), Table III (the paper's text (Singh et al., AxoNN)), AxoNN column",
  'source_kind': 'paper',
  'quote': '512 GPT-40B 44% 55% 35% 64%',
  'model': {'family': 'gpt',
            'layers': 38,
            'hidden': 9216,
            'heads': 72,
            'kv_heads': None,
            'ffn': 36864,
            'vocab': None,
            'seq': 2048,
            'params_b': 40.0,
            'hf_config': 'GPT2Config',
            'tied_embeddings': None},
  'hardware': 'a100-40gb',
  'gpus': 512,
  'mesh': {'tp': None, 'pp': 1, 'dp': None, 'cp': 1, 'ep': 1, 'vp': 1},
  'fsdp': None,
  'sequence_parallel': None,
  'schedule': None,
  'micro_batch': None,
  'global_batch': 2048,
  'recompute': 'full',
  'precision': 'bf16',
  'torch_compile': None,
  'published': {'tflops_per_gpu': None, 'tokens_per_s_per_gpu': None, 'mfu': 0.64, 'step_s': None},
  'notes': 'AxoNN column: 4D hybrid = 3D tensor parallelism (Agarwal-style Gx x Gy x Gz grid over each FC layer) x '
           "data parallelism, with the paper's communication optimizations; the grid sizes chosen for these runs are "
           'NOT published (mesh tp/dp None; no pipeline). This is a different tensor-parallel algorithm from Megatron '
           '1D TP, so it checks a cost model only as an upper bar. Other columns of the same row: Megatron-LM 44% (its '
           "TP/PP degrees are not given and 'we had to make slight adjustments to layers and hidden-sizes of the GPT "
           "models ... for Megatron-LM'), DeepSpeed-3D 35%. Perlmutter: 4x A100 40GB per node, four HPE Slingshot 11 "
           "NICs per node at 200 Gb/s each. 'we employ mixed precision (bf16/fp32) for all our training runs', "
           "activation checkpointing on. Batch 4M tokens at seq 2048 -> 2048 sequences (derived). Metric = 'hardware "
           "flop/s utilization': half-precision FLOP/s from Narayanan et al.'s analytical formula (Megatron Eq. 3, "
           'which counts the recompute forward) divided by 312 TFLOP/s per GPU; stored in the mfu field (derived '
           'TFLOP/s = pct*312). Iteration time = mean of the last 5 of 10 batches. Architecture: Table I (layers, '
           'hidden, heads); ffn 4h (GPT-3 style) and vocab are not stated (vocab None). Micro batch not stated. '
           'tied_embeddings unknown (None).'},
 {'id': 'axonn-t3-zero3-gpt-80b-1024gpu-a100',
  'source': "Singh, Singhania, Ranjan, Sating, Bhatele, 'A 4D Hybrid Algorithm to Scale Parallel Training to Thousands "
            "of GPUs' (AxoNN), Table III (the paper's text (Singh et al., AxoNN)), ZeRO-3 column",
  'source_kind': 'paper',
  'quote': '1024 GPT-80B 42% 27% 38% 57%',
  'model': {'family': 'gpt',
            'layers': 42,
            'hidden': 12288,
            'heads': 96,
            'kv_heads': None,
            'ffn': 49152,
            'vocab': None,
            'seq': 2048,
            'params_b': 80.0,
            'hf_config': 'GPT2Config',
            'tied_embeddings': None},
  'hardware': 'a100-40gb',
  'gpus': 1024,
  'mesh': {'tp': 1, 'pp': 1, 'dp': 1024, 'cp': 1, 'ep': 1, 'vp': 1},
  'fsdp': 'zero3',
  'sequence_parallel': False,
  'schedule': None,
  'micro_batch': None,
  'global_batch': 2048,
  'recompute': 'full',
  'precision': 'bf16',
  'torch_compile': None,
  'published': {'tflops_per_gpu': None, 'tokens_per_s_per_gpu': None, 'mfu': 0.27, 'step_s': None},
  'notes': 'ZeRO-3 (DeepSpeed stage 3) column: pure sharded data parallelism, dp = gpus. Perlmutter: 4x A100 40GB per '
           "node, four HPE Slingshot 11 NICs per node at 200 Gb/s each. 'we employ mixed precision (bf16/fp32) for all "
           "our training runs', activation checkpointing on. Batch 4M tokens at seq 2048 -> 2048 sequences (derived). "
           "Metric = 'hardware flop/s utilization': half-precision FLOP/s from Narayanan et al.'s analytical formula "
           '(Megatron Eq. 3, which counts the recompute forward) divided by 312 TFLOP/s per GPU; stored in the mfu '
           'field (derived TFLOP/s = pct*312). Iteration time = mean of the last 5 of 10 batches. Architecture: Table '
           'I (layers, hidden, heads); ffn 4h (GPT-3 style) and vocab are not stated (vocab None). Micro batch not '
           'stated. tied_embeddings unknown (None).'},
 {'id': 'axonn-t3-axonn4d-gpt-80b-1024gpu-a100',
  'source': "Singh, Singhania, Ranjan, Sating, Bhatele, 'A 4D Hybrid Algorithm to Scale Parallel Training to Thousands "
            "of GPUs' (AxoNN), Table III (the paper's text (Singh et al., AxoNN)), AxoNN column",
  'source_kind': 'paper',
  'quote': '1024 GPT-80B 42% 27% 38% 57%',
  'model': {'family': 'gpt',
            'layers': 42,
            'hidden': 12288,
            'heads': 96,
            'kv_heads': None,
            'ffn': 49152,
            'vocab': None,
            'seq': 2048,
            'params_b': 80.0,
            'hf_config': 'GPT2Config',
            'tied_embeddings': None},
  'hardware': 'a100-40gb',
  'gpus': 1024,
  'mesh': {'tp': None, 'pp': 1, 'dp': None, 'cp': 1, 'ep': 1, 'vp': 1},
  'fsdp': None,
  'sequence_parallel': None,
  'schedule': None,
  'micro_batch': None,
  'global_batch': 2048,
  'recompute': 'full',
  'precision': 'bf16',
  'torch_compile': None,
  'published': {'tflops_per_gpu': None, 'tokens_per_s_per_gpu': None, 'mfu': 0.57, 'step_s': None},
  'notes': 'AxoNN column: 4D hybrid = 3D tensor parallelism (Agarwal-style Gx x Gy x Gz grid over each FC layer) x '
           "data parallelism, with the paper's communication optimizations; the grid sizes chosen for these runs are "
           'NOT published (mesh tp/dp None; no pipeline). This is a different tensor-parallel algorithm from Megatron '
           '1D TP, so it checks a cost model only as an upper bar. Other columns of the same row: Megatron-LM 42% (its '
           "TP/PP degrees are not given and 'we had to make slight adjustments to layers and hidden-sizes of the GPT "
           "models ... for Megatron-LM'), DeepSpeed-3D 38%. Perlmutter: 4x A100 40GB per node, four HPE Slingshot 11 "
           "NICs per node at 200 Gb/s each. 'we employ mixed precision (bf16/fp32) for all our training runs', "
           "activation checkpointing on. Batch 4M tokens at seq 2048 -> 2048 sequences (derived). Metric = 'hardware "
           "flop/s utilization': half-precision FLOP/s from Narayanan et al.'s analytical formula (Megatron Eq. 3, "
           'which counts the recompute forward) divided by 312 TFLOP/s per GPU; stored in the mfu field (derived '
           'TFLOP/s = pct*312). Iteration time = mean of the last 5 of 10 batches. Architecture: Table I (layers, '
           'hidden, heads); ffn 4h (GPT-3 style) and vocab are not stated (vocab None). Micro batch not stated. '
           'tied_embeddings unknown (None).'}]
