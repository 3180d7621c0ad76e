"""Workload sizing core: parameter counts, memory line items, time, recommendations, bad input."""

from __future__ import annotations

import csv
import json
from decimal import Decimal

import pytest

from whaleflux.shared.catalog import gpu_models
from whaleflux.shared.datafiles import DATA_DIR
from whaleflux.shared.sizing import CATALOGUE, SizingError, SizingRequest, estimate, from_hf_config, load_config_file
from whaleflux.shared.sizing.memory import Split, per_gpu_memory, stage_memory
from whaleflux.shared.sizing.recommend import memory_floor_mib, reference_prices, splits_for
from whaleflux.shared.sizing.request import resolve
from whaleflux.shared.sizing.throughput import experts_touched, serving_speed, training_flops_per_token, training_speed

KiB, GiB = 1024, 1024**3

# Published parameter totals, with where they are published. Tolerance: 1%.
PUBLISHED_TOTALS = {
    "llama-3-8b": (8.03e9, "Hugging Face meta-llama/Meta-Llama-3-8B model page: 8.03B params"),
    "llama-3-70b": (70.6e9, "Hugging Face meta-llama/Meta-Llama-3-70B model page: 70.6B params"),
    "llama-3.1-8b": (8.03e9, "Hugging Face meta-llama/Llama-3.1-8B model page: 8.03B params"),
    "llama-3.1-70b": (70.6e9, "Hugging Face meta-llama/Llama-3.1-70B model page: 70.6B params"),
    "llama-3.1-405b": (405e9, "Meta Llama 3.1 model card: 405B"),
    "llama-3.2-1b": (1.23e9, "Meta Llama 3.2 model card: 1.23B"),
    "llama-3.2-3b": (3.21e9, "Meta Llama 3.2 model card: 3.21B"),
    "mistral-7b": (7.25e9, "Hugging Face mistralai/Mistral-7B-v0.3 model page: 7.25B params"),
    "mixtral-8x7b": (46.7e9, "Mistral AI, 'Mixtral of experts' (Dec 2023): 46.7B total"),
    "mixtral-8x22b": (141e9, "Mistral AI, 'Cheaper, Better, Faster, Stronger' (Apr 2024): 141B total"),
    "qwen2.5-7b": (7.61e9, "Qwen2.5-7B model card: 7.61B parameters"),
    "qwen2.5-72b": (72.7e9, "Qwen2.5-72B model card: 72.7B parameters"),
}
PUBLISHED_ACTIVE = {
    "mixtral-8x7b": (12.9e9, "Mistral AI, 'Mixtral of experts': 12.9B active per token"),
    "mixtral-8x22b": (39e9, "Mistral AI, 'Cheaper, Better, Faster, Stronger': 39B active"),
}
PUBLISHED_NON_EMBEDDING = {
    "qwen2.5-7b": (6.53e9, "Qwen2.5-7B model card: 6.53B non-embedding"),
    "qwen2.5-72b": (70.0e9, "Qwen2.5-72B model card: 70.0B non-embedding"),
}

# Meta-Llama-3-8B's config.json as published, extra keys included.
LLAMA3_8B_CONFIG = {
    "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0, "bos_token_id": 128000,
    "eos_token_id": 128001, "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
    "intermediate_size": 14336, "max_position_embeddings": 8192, "model_type": "llama", "num_attention_heads": 32,
    "num_hidden_layers": 32, "num_key_value_heads": 8, "pretraining_tp": 1, "rms_norm_eps": 1e-05,
    "rope_scaling": None, "rope_theta": 500000.0, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "transformers_version": "4.40.0.dev0", "use_cache": True, "vocab_size": 128256,
}


def workload(**kw):
    return resolve(SizingRequest(**kw))


def item(breakdown, key):
    return next(i for i in breakdown.items if i.key == key)


# ---------------------------------------------------------------- parameter counts


def test_catalogue_has_the_models_the_issue_names_and_a_published_total_for_each():
    required = {"llama-3-8b", "llama-3-70b", "llama-3.1-8b", "llama-3.1-70b", "llama-3.1-405b", "mistral-7b",
                "mixtral-8x7b", "mixtral-8x22b", "qwen2.5-7b", "qwen2.5-72b"}
    assert required <= set(CATALOGUE)
    assert set(PUBLISHED_TOTALS) == set(CATALOGUE)


@pytest.mark.parametrize("name", sorted(PUBLISHED_TOTALS))
def test_computed_parameter_count_is_within_1_percent_of_the_published_total(name):
    published, source = PUBLISHED_TOTALS[name]
    computed = CATALOGUE[name].total_params()
    assert computed == pytest.approx(published, rel=0.01), f"{name}: {computed:,} vs {published:,.0f} ({source})"


@pytest.mark.parametrize("name", sorted(PUBLISHED_ACTIVE))
def test_moe_active_parameters_are_within_1_percent_of_the_published_figure(name):
    published, source = PUBLISHED_ACTIVE[name]
    assert CATALOGUE[name].active_params() == pytest.approx(published, rel=0.01), source


@pytest.mark.parametrize("name", sorted(PUBLISHED_NON_EMBEDDING))
def test_non_embedding_parameters_are_within_1_percent_of_the_published_figure(name):
    a = CATALOGUE[name]
    published, source = PUBLISHED_NON_EMBEDDING[name]
    assert a.total_params() - a.embedding_params() - a.lm_head_params() == pytest.approx(published, rel=0.01), source


def test_tied_embeddings_are_counted_once():
    tied = CATALOGUE["llama-3.2-1b"]
    untied = tied.model_copy(update={"tied_embeddings": False})
    assert untied.total_params() - tied.total_params() == tied.vocab * tied.hidden


def test_a_published_config_json_gives_the_same_architecture_as_the_catalogue(tmp_path):
    path = tmp_path / "Meta-Llama-3-8B" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(LLAMA3_8B_CONFIG))
    arch = load_config_file(path)
    assert arch.name == "Meta-Llama-3-8B"
    assert arch.total_params() == CATALOGUE["llama-3-8b"].total_params()
    assert arch.kv_bytes_per_token(2) == CATALOGUE["llama-3-8b"].kv_bytes_per_token(2)


def test_a_moe_config_with_shared_experts_matches_its_published_counts():
    # Qwen/Qwen1.5-MoE-A2.7B config.json; model card: "14.3B parameters in total and 2.7B activated".
    config = {
        "model_type": "qwen2_moe", "num_hidden_layers": 24, "hidden_size": 2048, "num_attention_heads": 16,
        "num_key_value_heads": 16, "intermediate_size": 5632, "moe_intermediate_size": 1408,
        "shared_expert_intermediate_size": 5632, "num_experts": 60, "num_experts_per_tok": 4,
        "decoder_sparse_step": 1, "mlp_only_layers": [], "vocab_size": 151936, "max_position_embeddings": 8192,
        "tie_word_embeddings": False,
    }
    arch = from_hf_config(config)
    assert arch.total_params() == pytest.approx(14.3e9, rel=0.01)
    assert arch.active_params() == pytest.approx(2.7e9, rel=0.01)


# ---------------------------------------------------------------- acceptance figures


def test_llama_3_70b_parameters_weights_and_kv_cache_match_the_published_figures():
    a = CATALOGUE["llama-3-70b"]
    assert a.total_params() == pytest.approx(70.6e9, abs=0.1e9)  # "about 70.6 B"
    weights = item(stage_memory(workload(model="llama-3-70b"), Split()), "weights").bytes
    assert weights == pytest.approx(141e9, abs=0.5e9)  # "about 141 GB" in bf16, decimal GB
    assert a.kv_bytes_per_token(2) == 320 * KiB  # 80 layers x 8 KV heads x 128 x 2 (K and V) x 2 B, exact


def test_one_128k_token_sequence_of_llama_3_70b_takes_40_gib_of_kv_cache():
    w = workload(model="llama-3.1-70b", context=128 * 1024)  # Llama 3.1 70B: the 70B architecture with 128K context
    assert item(stage_memory(w, Split()), "kv_cache").bytes == 40 * GiB  # exact


def test_llama_3_8b_kv_cache_is_128_kib_per_token():
    assert CATALOGUE["llama-3-8b"].kv_bytes_per_token(2) == 128 * KiB
    w = workload(model="llama-3-8b", context=1000, batch=3)
    assert item(stage_memory(w, Split()), "kv_cache").bytes == 128 * KiB * 1000 * 3


def test_qlora_70b_at_8k_fits_one_h100_and_one_a100_but_not_one_rtx4090():
    report = estimate(SizingRequest(model="llama-3-70b", task="qlora", context=8192))
    lines = {line.split()[1] if line.startswith("1x") else line.split(":")[0]: line for line in report.per_gpu_model}
    assert lines["H100"].startswith("1x H100 fits") and lines["A100"].startswith("1x A100 fits")
    assert "2.2x slower" in lines["A100"] or "2.5x slower" in lines["A100"]  # the yaml's finetune speed ratios
    assert lines["RTX4090"].startswith("RTX4090: needs ")
    assert 40 * GiB < report.memory_total_bytes < 75 * GiB


# ---------------------------------------------------------------- attention variants, budgets, training stacks

# Gemma 2 9B's published config.json, the values the estimator reads (google/gemma-2-9b): 42 layers alternating
# 4,096-token sliding-window (even layers) and global attention.
GEMMA2_9B_CONFIG = {
    "model_type": "gemma2", "num_hidden_layers": 42, "hidden_size": 3584, "num_attention_heads": 16,
    "num_key_value_heads": 8, "head_dim": 256, "intermediate_size": 14336, "vocab_size": 256000,
    "max_position_embeddings": 8192, "sliding_window": 4096, "tie_word_embeddings": True,
}


def test_a_mistral_style_sliding_window_caps_every_layers_kv_cache_at_the_window():
    cfg = {**LLAMA3_8B_CONFIG, "model_type": "mistral", "max_position_embeddings": 32768, "sliding_window": 4096}
    req = SizingRequest(config=cfg, context=32768, batch=2)
    kv = item(stage_memory(resolve(req), Split()), "kv_cache")
    assert kv.bytes == 128 * KiB * 4096 * 2  # 1/8 of full attention at 32K
    assert "sliding-window layers x 4096 tokens" in kv.note
    report = estimate(req)
    assert any("32 of 32 layers use a 4096-token sliding window" in a for a in report.assumptions)
    assert any("sliding-window attention" in n for n in report.notes)
    # Shorter than the window: the same as full attention.
    short = SizingRequest(config=cfg, context=2048)
    assert item(stage_memory(resolve(short), Split()), "kv_cache").bytes == 128 * KiB * 2048


def test_gemma2_alternating_local_and_global_layers_cache_the_window_in_half_of_them():
    w = resolve(SizingRequest(config=GEMMA2_9B_CONFIG, context=8192))
    assert (w.arch.sliding_window, w.arch.sliding_layers) == (4096, 21)
    per_layer_token = 2 * 8 * 256 * 2  # K and V, 8 KV heads x 256 x bf16
    assert item(stage_memory(w, Split()), "kv_cache").bytes == per_layer_token * (21 * 8192 + 21 * 4096)
    # Two pipeline stages hold half the layers each, and half of each kind.
    first = stage_memory(w, Split(pp=2), "first")
    assert item(first, "kv_cache").bytes == per_layer_token * (10.5 * 8192 + 10.5 * 4096)
    # The same from an explicit layer list (newer configs), and none when the window is switched off (Qwen2).
    listed = {**GEMMA2_9B_CONFIG, "model_type": "gemma3_text",
              "layer_types": ["sliding_attention"] * 35 + ["full_attention"] * 7}
    assert from_hf_config(listed).sliding_layers == 35
    assert from_hf_config({**GEMMA2_9B_CONFIG, "use_sliding_window": False}).sliding_window == 0


def _h100_serving_batch_between(lo: float, hi: float) -> int:
    """A batch of Llama 3 8B 8K sequences whose one-GPU memory is between lo and hi of an H100's."""
    capacity = gpu_models()["H100"].memory_mib * 1024**2
    for batch in range(1, 200):
        total = stage_memory(resolve(SizingRequest(model="llama-3-8b", context=8192, batch=batch)), Split()).total_bytes
        if lo * capacity < total <= hi * capacity:
            return batch
    raise AssertionError("no batch in the band")


def test_serving_fits_within_vllms_default_90_percent_budget_and_the_budget_is_settable():
    batch = _h100_serving_batch_between(0.905, 0.99)  # fits the GPU, not vLLM's default budget
    base = dict(model="llama-3-8b", context=8192, batch=batch, gpus=["H100"])
    default = estimate(SizingRequest(**base))
    assert default.workload["memory_budget"] == 0.9 and default.workload["stack"] == "vllm"
    assert not any(o.count == 1 for o in default.options)
    assert any("90% of the GPU's memory" in a and "gpu_memory_utilization" in a for a in default.assumptions)
    full = estimate(SizingRequest(**base, gpu_memory_utilization=1.0))
    [one] = [o for o in full.options if o.count == 1 and o.best_split]
    assert one.budget_bytes == one.capacity_bytes and one.per_gpu_bytes <= one.capacity_bytes
    small = _h100_serving_batch_between(0.5, 0.85)
    fits = estimate(SizingRequest(**{**base, "batch": small}))
    [one] = [o for o in fits.options if o.count == 1 and o.best_split]
    assert one.budget_bytes == int(one.capacity_bytes * 0.9)
    assert "budget (90% of" in fits.per_gpu_model[0]


# Unsloth's published minimum VRAM for QLoRA (4-bit), unsloth.ai/docs/get-started/fine-tuning-for-beginners/
# unsloth-requirements: "8B 6 GB", "70B 41 GB" (docs/sizing.md: read as GiB of the allocator's peak, which
# leaves out the CUDA context).
UNSLOTH_QLORA_MINIMUM_GIB = {"llama-3.1-8b": 6, "llama-3.1-70b": 41}


@pytest.mark.parametrize("model", sorted(UNSLOTH_QLORA_MINIMUM_GIB))
def test_qlora_on_the_unsloth_stack_matches_unsloths_published_minimum(model):
    published = UNSLOTH_QLORA_MINIMUM_GIB[model]
    w = resolve(SizingRequest(model=model, task="qlora", context=512, training_stack="unsloth"))
    mem = stage_memory(w, Split())
    allocator = mem.total_bytes - GiB  # without the CUDA context torch's memory statistics leave out
    assert allocator / GiB == pytest.approx(published, rel=0.10)
    assert w.optimizer == "adamw-8bit"  # Unsloth's default
    peft = stage_memory(resolve(SizingRequest(model=model, task="qlora", context=512)), Split())
    assert peft.total_bytes > mem.total_bytes  # fp32 adapters, fp32 logits copy, checkpoints on the GPU
    assert "offloaded to CPU RAM" in item(mem, "activations_checkpointed").note
    assert item(mem, "lora_weights").note.endswith("bf16") and item(peft, "lora_weights").note.endswith("fp32")


def test_the_report_states_the_training_stack_it_assumes():
    for stack, words in (("peft", "Hugging Face PEFT + bitsandbytes"), ("unsloth", "Unsloth (fused kernels)")):
        report = estimate(SizingRequest(model="llama-3-8b", task="qlora", training_stack=stack))
        assert report.workload["stack"] == stack
        assert any(a.startswith(f"Stack: {words}") for a in report.assumptions)
    assert estimate(SizingRequest(model="llama-3-8b", task="lora")).workload["stack"] == "peft"


# ---------------------------------------------------------------- memory line items


def test_full_fine_tune_with_adamw_keeps_16_bytes_per_parameter_and_8bit_adam_10():
    n = CATALOGUE["llama-3-8b"].total_params()
    for optimizer, per_param in (("adamw", 16), ("adamw-8bit", 10)):
        m = stage_memory(workload(model="llama-3-8b", task="full", optimizer=optimizer), Split())
        states = sum(item(m, k).bytes for k in ("weights", "gradients", "optimizer"))
        assert states == pytest.approx(per_param * n, rel=1e-6)  # bf16 weights and grads, fp32 master + states


def test_lora_trains_only_adapters_whose_states_are_fp32_weights_grads_and_adam():
    w = workload(model="llama-3-8b", task="lora", lora_rank=8, lora_targets=["q_proj", "v_proj"])
    m = stage_memory(w, Split())
    n = 32 * 8 * ((4096 + 4096) + (4096 + 1024))  # layers x rank x (in + out) for q and v
    assert item(m, "lora_weights").bytes == n * 4
    assert item(m, "lora_gradients").bytes == n * 4 and item(m, "lora_optimizer").bytes == n * 8
    assert not {"gradients", "optimizer"} & {i.key for i in m.items}


def test_checkpointing_counts_one_activation_line_and_shows_both():
    on = stage_memory(workload(model="llama-3-8b", task="full", context=4096), Split())
    off = stage_memory(workload(model="llama-3-8b", task="full", context=4096, checkpointing=False), Split())
    assert item(on, "activations_checkpointed").counted and not item(on, "activations_full").counted
    assert item(off, "activations_full").counted and not item(off, "activations_checkpointed").counted
    assert item(on, "activations_checkpointed").bytes * 5 < item(on, "activations_full").bytes
    assert on.total_bytes < off.total_bytes


def test_4bit_weights_carry_their_scales_and_keep_embeddings_in_bf16():
    a = CATALOGUE["llama-3-70b"]
    nf4 = item(stage_memory(workload(model="llama-3-70b", weight_dtype="nf4"), Split()), "weights").bytes
    expected = a.layers * a.layer_linear() * 4.127 / 8 + (a.total_params() - a.layers * a.layer_linear()) * 2
    assert nf4 == pytest.approx(expected, rel=1e-6)


def test_tensor_parallel_divides_weights_and_kv_cache_and_pipeline_divides_layers():
    w = workload(model="llama-3.1-70b", context=32768, batch=4)
    one = stage_memory(w, Split())
    tp8 = per_gpu_memory(w, Split(tp=8))
    assert item(tp8, "weights").bytes == pytest.approx(item(one, "weights").bytes / 8, rel=1e-6)
    assert item(tp8, "kv_cache").bytes == item(one, "kv_cache").bytes / 8  # 8 KV heads, one per GPU
    pp2 = per_gpu_memory(w, Split(pp=2))
    assert item(pp2, "kv_cache").bytes == item(one, "kv_cache").bytes / 2
    assert item(one, "weights").bytes / 2 < item(pp2, "weights").bytes < item(one, "weights").bytes * 0.51


def test_kv_heads_are_replicated_when_tensor_parallel_exceeds_them():
    cfg = {**LLAMA3_8B_CONFIG, "num_key_value_heads": 2}
    w = resolve(SizingRequest(config=cfg, context=4096))
    one = item(stage_memory(w, Split()), "kv_cache").bytes
    assert item(per_gpu_memory(w, Split(tp=4)), "kv_cache").bytes == one / 2  # each GPU keeps 1 of the 2 heads


def test_fsdp_shards_weights_gradients_and_optimizer_states_but_not_activations():
    w = workload(model="llama-3-8b", task="full", context=2048)
    one, dp8 = stage_memory(w, Split()), per_gpu_memory(w, Split(dp=8))
    for key in ("weights", "gradients", "optimizer"):
        assert item(dp8, key).bytes == pytest.approx(item(one, key).bytes / 8, abs=1)
    assert item(dp8, "activations_checkpointed").bytes == item(one, "activations_checkpointed").bytes
    assert item(dp8, "fsdp_buffers").bytes > 0


def test_splits_respect_heads_and_tensor_parallel_stays_in_a_node():
    w = workload(model="qwen2.5-7b")  # 28 heads: tp 8 does not divide them
    assert {s.tp for s in splits_for(w, 8)} == {1, 2, 4}
    assert all(s.tp <= 8 for s in splits_for(workload(model="llama-3-8b"), 64))
    assert all(s.dp == 1 for s in splits_for(w, 8))  # serving has no data-parallel split


# ---------------------------------------------------------------- time


def test_training_flops_follow_6n_plus_attention_and_4n_for_lora():
    a = CATALOGUE["llama-3-8b"]
    n, attention = a.matmul_params(), 12 * a.layers * a.q_dim * 4096
    assert training_flops_per_token(workload(model="llama-3-8b", task="full"))["total"] == 6 * n + attention
    lora = workload(model="llama-3-8b", task="lora")
    assert training_flops_per_token(lora)["total"] == 4 * n + attention + 6 * a.lora_params(16, lora.lora_targets)


def test_training_time_uses_mfu_on_the_a100_peak_scaled_by_each_gpus_speed():
    models = gpu_models()
    from whaleflux.shared.catalog import multi_gpu_efficiency

    eff = multi_gpu_efficiency()
    w = workload(model="llama-3-8b", task="full", dataset_tokens=10**9, mfu=0.5)
    a100 = training_speed(w, models["A100"], Split(), models["A100"], eff)
    h100 = training_speed(w, models["H100"], Split(), models["A100"], eff)
    per_token = training_flops_per_token(w)["total"]
    eight = training_speed(w, models["H100"], Split(dp=8), models["A100"], eff)
    assert a100.seconds is not None and h100.seconds is not None and eight.seconds is not None  # tokens given
    assert a100.seconds == pytest.approx(1e9 * per_token / (0.5 * 312e12), rel=1e-9)
    assert a100.seconds / h100.seconds == pytest.approx(models["H100"].speed["finetune"], rel=1e-9)
    assert h100.seconds / eight.seconds == pytest.approx(8 * eff["nvlink"], rel=1e-9)


def test_serving_decode_is_bounded_by_reading_weights_and_kv_at_peak_bandwidth():
    a = CATALOGUE["llama-3-8b"]
    w = workload(model="llama-3-8b", context=4096)
    speed = serving_speed(w, gpu_models()["H100"], Split())
    read = (a.total_params() - a.embedding_params()) * 2 + 128 * KiB * 4096  # the lookup table is not read
    assert speed.bound == "memory bandwidth"
    assert speed.tokens_per_s == pytest.approx(3.35e12 / read, rel=1e-3)


def test_moe_decode_reads_only_the_experts_its_tokens_use():
    assert experts_touched(8, 2, 1) == pytest.approx(2)
    assert experts_touched(8, 2, 64) == pytest.approx(8, rel=1e-6)
    h200 = gpu_models()["H200"]
    one = serving_speed(workload(model="mixtral-8x7b", context=1024), h200, Split())
    dense_read = item(stage_memory(workload(model="mixtral-8x7b", context=1024), Split()), "weights").bytes
    assert one.tokens_per_s > 4.8e12 / dense_read * 2.5  # 2 of 8 experts read, not all


# ---------------------------------------------------------------- recommendations


def test_options_fit_and_are_ranked_by_cost_and_by_time():
    report = estimate(SizingRequest(model="llama-3-70b", task="lora", context=4096, dataset_tokens=10**8, max_gpus=16))
    opts = report.options
    assert opts and all(o.per_gpu_bytes <= o.capacity_bytes for o in opts)
    costs = [o.usd_per_million_tokens for o in opts if o.usd_per_million_tokens is not None]
    assert len(costs) == len(opts)  # every option is priced
    assert costs == sorted(costs) and [o.cost_rank for o in opts] == list(range(1, len(opts) + 1))
    by_time = sorted(opts, key=lambda o: o.time_rank)
    assert [o.tokens_per_s for o in by_time] == sorted((o.tokens_per_s for o in opts), reverse=True)
    assert all(o.usd_per_hour is not None and o.seconds is not None
               and o.cost_usd == pytest.approx(o.usd_per_hour * o.seconds / 3600) for o in opts)
    assert {o.count for o in opts} <= {1, 2, 4, 8, 16}


def test_serving_options_are_ranked_by_hourly_cost():
    report = estimate(SizingRequest(model="mixtral-8x22b", context=65536, batch=32))
    hourly = [o.usd_per_hour for o in report.options if o.usd_per_hour is not None]
    assert len(hourly) == len(report.options) and hourly == sorted(hourly)
    # 262 GiB of bf16 weights + 448 GiB of KV cache: eight H200s with tensor parallelism.
    assert any(line.startswith("H200: needs 8 with tensor-parallel split (tp8;") for line in report.per_gpu_model)
    assert all(o.bound for o in report.options)


def test_reference_prices_are_the_csv_rows_billing_uses_and_are_labelled_reference():
    from whaleflux.billing.pricing import REFERENCE_RATES

    prices = reference_prices()
    assert set(prices) == set(gpu_models())
    for key, price in prices.items():
        assert Decimal(str(price.usd_per_gpu_hour)) == REFERENCE_RATES[key].usd_per_gpu_hour
        assert price.reference
    with open(DATA_DIR / "prices-reference.csv", newline="") as f:
        assert any(r["usd_per_gpu_hour"] == "6.88" and r["gpu"] == "H100 SXM 80GB" for r in csv.DictReader(f))
    report = estimate(SizingRequest(model="llama-3-8b", gpus=["H100"], prices={"H100": 2.0}))
    assert not report.prices["H100"].reference
    assert report.options[0].usd_per_hour == 2.0 * report.options[0].count
    assert any("reference prices" in a.lower() for a in report.assumptions)


def test_a_workload_too_big_for_the_gpu_limit_reports_that_nothing_fits():
    report = estimate(SizingRequest(model="llama-3.1-405b", task="full", context=8192, max_gpus=8))
    assert report.options == []
    assert all("does not fit on 8 or fewer" in line for line in report.per_gpu_model)


def test_memory_floor_for_the_scheduler_shrinks_with_more_gpus():
    req = SizingRequest(model="llama-3-70b", context=8192)
    one, two = memory_floor_mib(req, 1), memory_floor_mib(req, 2)
    assert one > 141e9 / 1024**2 and two < one * 0.6
    with pytest.raises(SizingError) as err:
        memory_floor_mib(SizingRequest(model="qwen2.5-7b"), 3 * 1024)  # pp would exceed the 28 layers, tp > 8
    assert err.value.field == "gpus"


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    "fields, field, words",
    [
        ({"model": "llama-9-70b"}, "model", ["unknown model 'llama-9-70b'", "llama-3-70b"]),
        ({}, "model", ["exactly one of"]),
        ({"model": "llama-3-70b", "context": 131072}, "context", ["131072", "8192", "llama-3.1-70b supports it"]),
        ({"model": "mixtral-8x22b", "context": 131072}, "context", ["65536"]),
        ({"model": "llama-3-8b", "task": "qlora", "weight_dtype": "bf16"}, "weight_dtype", ["4-bit", "lora"]),
        ({"model": "llama-3-8b", "task": "full", "weight_dtype": "int4"}, "weight_dtype", ["full fine-tune"]),
        ({"model": "llama-3-8b", "task": "lora", "weight_dtype": "nf4"}, "weight_dtype", ["qlora"]),
        ({"model": "llama-3-8b", "lora_rank": 16}, "lora_rank", ["serve"]),
        ({"model": "llama-3-8b", "dataset_tokens": 100}, "dataset_tokens", ["training only"]),
        ({"model": "llama-3-8b", "task": "full", "kv_dtype": "fp8"}, "kv_dtype", ["serving only"]),
        ({"model": "llama-3-8b", "task": "lora", "lora_targets": ["attn"]}, "lora_targets", ["'attn'"]),
        ({"model": "llama-3-8b", "gpus": ["V100"]}, "gpus", ["'V100'"]),
        ({"model": "llama-3-8b", "prices": {"H100": 0}}, "prices", ["positive number"]),
        ({"model": "llama-3-8b", "training_stack": "unsloth"}, "training_stack", ["lora/qlora only"]),
        ({"model": "llama-3-8b", "task": "full", "training_stack": "unsloth"}, "training_stack", ["lora/qlora"]),
        ({"model": "llama-3-8b", "task": "qlora", "gpu_memory_utilization": 0.8}, "gpu_memory_utilization",
         ["serving only"]),
    ],
)
def test_bad_input_raises_an_error_naming_the_field(fields, field, words):
    with pytest.raises(SizingError) as err:
        estimate(SizingRequest(**fields))
    assert err.value.field == field
    assert str(err.value).startswith(f"{field}: ")
    for w in words:
        assert w in str(err.value)


@pytest.mark.parametrize(
    "config, words",
    [
        ({**LLAMA3_8B_CONFIG, "hidden_size": "4096"}, ["hidden_size must be an integer", "'4096'"]),
        ({k: v for k, v in LLAMA3_8B_CONFIG.items() if k != "num_hidden_layers"}, ["missing num_hidden_layers"]),
        ({**LLAMA3_8B_CONFIG, "num_key_value_heads": 5}, ["not a multiple of num_key_value_heads 5"]),
        ({**LLAMA3_8B_CONFIG, "model_type": "gpt2"}, ["'gpt2'"]),
        ({**LLAMA3_8B_CONFIG, "kv_lora_rank": 512}, ["multi-head latent attention", "compressed latent"]),
        ({**LLAMA3_8B_CONFIG, "attention_chunk_size": 8192}, ["chunked local attention", "not modelled"]),
        ({**LLAMA3_8B_CONFIG, "layer_types": ["linear_attention"] * 32}, ["layer_types linear_attention"]),
        ({**LLAMA3_8B_CONFIG, "sliding_window": 4096, "layer_types": ["sliding_attention"] * 3},
         ["one type per layer (32)"]),
        ([1, 2], ["expected a JSON object"]),
    ],
)
def test_a_bad_config_json_is_refused_with_the_reason(config, words):
    with pytest.raises(SizingError) as err:
        from_hf_config(config)
    assert err.value.field == "config"
    for w in words:
        assert w in str(err.value)


def test_a_malformed_config_json_file_names_the_file_and_the_position(tmp_path):
    path = tmp_path / "config.json"
    path.write_text('{"hidden_size": 4096,, }')
    with pytest.raises(SizingError) as err:
        load_config_file(path)
    assert "not valid JSON" in str(err.value) and str(path) in str(err.value) and "line 1" in str(err.value)
    with pytest.raises(SizingError, match="cannot read"):
        load_config_file(tmp_path / "missing.json")
