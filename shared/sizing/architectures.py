"""Model architectures: the built-in catalogue and Hugging Face config.json files.

Catalogue entries hold the values each model's published `config.json` gives
(on the Hugging Face Hub, under the repository named in `source`); they go
through the same parser as a user's file. Parameter counts are computed from
the architecture (embeddings, attention with grouped-query KV heads, gated MLP
or mixture-of-experts, norms, tied or separate LM head), never stored, so the
tests can hold them against the published totals.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from .errors import SizingError

# Decoder families whose MLP is gated (SwiGLU/GeGLU: gate, up, down) with RMSNorm.
GATED_TYPES = {
    "llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "gemma", "gemma2", "phi3", "granite",
}
# Families with a different layout (plain 2-matrix MLP, LayerNorm with bias, fused
# or multi-query blocks): counting them as Llama-style would be wrong, so refuse.
UNSUPPORTED_TYPES = {"gpt2", "gpt_neox", "gptj", "opt", "bloom", "falcon", "bert", "t5", "mpt", "gpt_bigcode", "phi"}
# Families whose q/k/v projections carry a bias even without `attention_bias`.
QKV_BIAS_TYPES = {"qwen2", "qwen2_moe"}
# Families whose config leaves tie_word_embeddings out when it is false.
UNTIED_BY_DEFAULT = {"llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "phi3", "granite"}

LORA_MODULES = ("q", "k", "v", "o", "gate", "up", "down")


class Architecture(BaseModel):
    """A decoder-only transformer, as far as memory and FLOPs are concerned."""

    model_config = ConfigDict(frozen=True)

    name: str
    source: str
    model_type: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    max_context: int
    tied_embeddings: bool
    qkv_bias: bool = False
    o_bias: bool = False
    experts: int = 0  # 0: dense MLP
    experts_per_token: int = 0
    expert_intermediate: int = 0
    shared_expert_intermediate: int = 0
    # Sliding-window attention: `sliding_layers` of the layers attend to (and cache) only the last
    # `sliding_window` tokens; the others attend to the whole context.
    sliding_window: int = 0
    sliding_layers: int = 0
    notes: tuple[str, ...] = ()

    # ------------------------------------------------------------ shapes

    @property
    def q_dim(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def is_moe(self) -> bool:
        return self.experts > 0

    def module_shapes(self) -> dict[str, tuple[int, int, int]]:
        """LoRA-targetable module -> (in features, out features, copies per layer)."""
        h, e = self.hidden, max(self.experts, 1)
        i = self.expert_intermediate if self.is_moe else self.intermediate
        shapes = {
            "q": (h, self.q_dim, 1),
            "k": (h, self.kv_dim, 1),
            "v": (h, self.kv_dim, 1),
            "o": (self.q_dim, h, 1),
            "gate": (h, i, e),
            "up": (h, i, e),
            "down": (i, h, e),
        }
        return shapes

    # ------------------------------------------------------------ parameter counts

    def attention_weights(self) -> int:
        return 2 * self.hidden * self.q_dim + 2 * self.hidden * self.kv_dim

    def attention_biases(self) -> int:
        return (self.q_dim + 2 * self.kv_dim if self.qkv_bias else 0) + (self.hidden if self.o_bias else 0)

    def expert_weights(self) -> int:
        """One gated MLP (gate, up, down) of a dense layer or of one expert."""
        i = self.expert_intermediate if self.is_moe else self.intermediate
        return 3 * self.hidden * i

    def shared_expert_weights(self) -> int:
        if not self.shared_expert_intermediate:
            return 0
        # The shared expert's own MLP plus its scalar gate (Qwen-MoE).
        return 3 * self.hidden * self.shared_expert_intermediate + self.hidden

    def router_weights(self) -> int:
        return self.hidden * self.experts if self.is_moe else 0

    def layer_linear(self) -> int:
        """Weights of one layer's projection matrices: what quantization shrinks."""
        return self.attention_weights() + self.expert_weights() * max(self.experts, 1) + self.shared_expert_weights()

    def layer_other(self) -> int:
        """Biases, the two RMSNorm weights and the router: kept in 16-bit."""
        return self.attention_biases() + 2 * self.hidden + self.router_weights()

    def layer_params(self) -> int:
        return self.layer_linear() + self.layer_other()

    def embedding_params(self) -> int:
        return self.vocab * self.hidden

    def lm_head_params(self) -> int:
        return 0 if self.tied_embeddings else self.vocab * self.hidden

    def total_params(self) -> int:
        return self.layers * self.layer_params() + self.embedding_params() + self.lm_head_params() + self.hidden

    def active_params(self) -> int:
        """Parameters one token uses (all of them for a dense model; k experts of E for MoE)."""
        if not self.is_moe:
            return self.total_params()
        unused = (self.experts - self.experts_per_token) * self.expert_weights()
        return self.total_params() - self.layers * unused

    def matmul_params(self) -> int:
        """Weights one token multiplies through: the N in ~6·N FLOPs per token.

        The embedding is a lookup (no FLOPs); the LM head is a matmul even when tied.
        """
        per_layer = (
            self.attention_weights()
            + self.experts_per_token_or_one() * self.expert_weights()
            + self.shared_expert_weights()
            + self.router_weights()
        )
        return self.layers * per_layer + self.vocab * self.hidden

    def experts_per_token_or_one(self) -> int:
        return self.experts_per_token if self.is_moe else 1

    def lora_params(self, rank: int, targets: tuple[str, ...]) -> int:
        """LoRA A and B matrices (rank x in + out x rank) on every targeted module of every layer."""
        shapes = self.module_shapes()
        per_layer = sum(rank * (shapes[t][0] + shapes[t][1]) * shapes[t][2] for t in targets)
        if self.shared_expert_intermediate:
            sh = self.shared_expert_intermediate
            per_layer += sum(rank * (self.hidden + sh) for t in targets if t in ("gate", "up", "down"))
        return self.layers * per_layer

    def kv_bytes_per_token(self, bytes_per_value: float) -> float:
        """K and V for every layer: 2 x layers x KV heads x head dim x bytes (before any sliding window)."""
        return 2 * self.layers * self.kv_heads * self.head_dim * bytes_per_value

    def kv_tokens(self, layers: int, context: int) -> float:
        """Tokens of K and V that `layers` of this model's layers cache for one sequence of `context` tokens: a
        sliding-window layer keeps at most its window; a stage of a pipeline holds its share of sliding layers."""
        if not self.sliding_window:
            return float(layers * context)
        sliding = layers * self.sliding_layers / self.layers
        return (layers - sliding) * context + sliding * min(context, self.sliding_window)

    def summary(self) -> dict[str, int]:
        return {
            "total_params": self.total_params(),
            "active_params": self.active_params(),
            "matmul_params_per_token": self.matmul_params(),
        }


# ---------------------------------------------------------------- the catalogue

# name -> (Hugging Face repository whose config.json these values are from, values).
_PUBLISHED: dict[str, tuple[str, dict[str, Any]]] = {}


def _llama(layers: int, hidden: int, heads: int, kv: int, inter: int, vocab: int, ctx: int, tied: bool = False,
           head_dim: int | None = None) -> dict[str, Any]:
    cfg: dict[str, Any] = {
        "model_type": "llama", "num_hidden_layers": layers, "hidden_size": hidden, "num_attention_heads": heads,
        "num_key_value_heads": kv, "intermediate_size": inter, "vocab_size": vocab,
        "max_position_embeddings": ctx, "tie_word_embeddings": tied,
    }
    if head_dim:
        cfg["head_dim"] = head_dim
    return cfg


_PUBLISHED.update({
    "llama-3-8b": ("meta-llama/Meta-Llama-3-8B", _llama(32, 4096, 32, 8, 14336, 128256, 8192)),
    "llama-3-70b": ("meta-llama/Meta-Llama-3-70B", _llama(80, 8192, 64, 8, 28672, 128256, 8192)),
    "llama-3.1-8b": ("meta-llama/Llama-3.1-8B", _llama(32, 4096, 32, 8, 14336, 128256, 131072)),
    "llama-3.1-70b": ("meta-llama/Llama-3.1-70B", _llama(80, 8192, 64, 8, 28672, 128256, 131072)),
    "llama-3.1-405b": ("meta-llama/Llama-3.1-405B", _llama(126, 16384, 128, 8, 53248, 128256, 131072)),
    "llama-3.2-1b": ("meta-llama/Llama-3.2-1B", _llama(16, 2048, 32, 8, 8192, 128256, 131072, tied=True, head_dim=64)),
    "llama-3.2-3b": ("meta-llama/Llama-3.2-3B", _llama(28, 3072, 24, 8, 8192, 128256, 131072, tied=True, head_dim=128)),
    "mistral-7b": ("mistralai/Mistral-7B-v0.3", {
        "model_type": "mistral", "num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32,
        "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 32768,
        "max_position_embeddings": 32768, "tie_word_embeddings": False,
    }),
    "mixtral-8x7b": ("mistralai/Mixtral-8x7B-v0.1", {
        "model_type": "mixtral", "num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32,
        "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 32000,
        "max_position_embeddings": 32768, "tie_word_embeddings": False,
        "num_local_experts": 8, "num_experts_per_tok": 2,
    }),
    "mixtral-8x22b": ("mistralai/Mixtral-8x22B-v0.1", {
        "model_type": "mixtral", "num_hidden_layers": 56, "hidden_size": 6144, "num_attention_heads": 48,
        "num_key_value_heads": 8, "intermediate_size": 16384, "vocab_size": 32768,
        "max_position_embeddings": 65536, "tie_word_embeddings": False,
        "num_local_experts": 8, "num_experts_per_tok": 2,
    }),
    # Qwen2.5 base models: config.json and model card give 131,072 tokens of context
    # (the Instruct configs say 32,768 and reach 128K with YaRN rope scaling).
    "qwen2.5-7b": ("Qwen/Qwen2.5-7B", {
        "model_type": "qwen2", "num_hidden_layers": 28, "hidden_size": 3584, "num_attention_heads": 28,
        "num_key_value_heads": 4, "intermediate_size": 18944, "vocab_size": 152064,
        "max_position_embeddings": 131072, "tie_word_embeddings": False,
    }),
    "qwen2.5-72b": ("Qwen/Qwen2.5-72B", {
        "model_type": "qwen2", "num_hidden_layers": 80, "hidden_size": 8192, "num_attention_heads": 64,
        "num_key_value_heads": 8, "intermediate_size": 29568, "vocab_size": 152064,
        "max_position_embeddings": 131072, "tie_word_embeddings": False,
    }),
})


def _aliases() -> dict[str, str]:
    out = {}
    for name, (repo, _) in _PUBLISHED.items():
        out[name] = name
        out[repo.lower()] = name
        out[repo.split("/")[-1].lower()] = name
    return out


def from_hf_config(config: Any, name: str = "config.json", source: str = "config.json") -> Architecture:
    """Build an Architecture from the contents of a Hugging Face config.json."""
    model_type = _model_type(config, name)
    read = _ConfigReader(config, name)
    layers = read.integer("num_hidden_layers")
    hidden = read.integer("hidden_size")
    heads = read.integer("num_attention_heads")
    kv_heads = read.integer("num_key_value_heads", default=heads)
    if heads % kv_heads:
        raise SizingError(
            "config", f"{name}: num_attention_heads {heads} is not a multiple of num_key_value_heads {kv_heads}")
    if config.get("head_dim") is None and hidden % heads:
        raise SizingError(
            "config", f"{name}: hidden_size {hidden} is not divisible by num_attention_heads {heads}; give head_dim")
    head_dim = read.integer("head_dim", default=hidden // heads)
    experts = read.integer("num_local_experts", "num_experts", default=0, minimum=0)
    inter = read.integer("intermediate_size", default=0 if experts else None, minimum=0)
    vocab = read.integer("vocab_size")
    max_context = read.integer("max_position_embeddings", "max_sequence_length", "seq_length")
    notes: list[str] = []
    if model_type not in GATED_TYPES:
        notes.append(f"model_type {model_type!r} is not one the estimator knows; counted as a Llama-style decoder")
    tied = config.get("tie_word_embeddings")
    if tied is None:
        tied = model_type not in UNTIED_BY_DEFAULT  # transformers' PretrainedConfig default is True
    bias = bool(config.get("attention_bias", False))
    window, sliding = _sliding_window(config, read, model_type, layers)
    if sliding:
        kind = "every layer" if sliding == layers else f"{sliding} of {layers} layers (the others global)"
        notes.append(f"sliding-window attention: {kind} cache at most {window} tokens")
    return Architecture(
        name=name, source=source, model_type=model_type, layers=layers, hidden=hidden, heads=heads,
        kv_heads=kv_heads, head_dim=head_dim, intermediate=inter, vocab=vocab, max_context=max_context,
        tied_embeddings=bool(tied), qkv_bias=bias or model_type in QKV_BIAS_TYPES, o_bias=bias, notes=tuple(notes),
        sliding_window=window, sliding_layers=sliding,
        **_mixture_of_experts(read, experts, inter),
    )


def _model_type(config: Any, name: str) -> str:
    """The config's model_type, once it is known to be a config this estimator can read."""
    if not isinstance(config, dict):
        raise SizingError("config", f"{name}: expected a JSON object, got {type(config).__name__}")
    if "text_config" in config and "hidden_size" not in config:
        raise SizingError(
            "config", f"{name}: a multimodal config (text_config); pass the language model's own config.json"
        )
    model_type = str(config.get("model_type", "")) or "unknown"
    if model_type in UNSUPPORTED_TYPES:
        raise SizingError(
            "config",
            f"{name}: model_type {model_type!r} is not a Llama-style decoder (gated MLP, RMSNorm); "
            f"supported: {', '.join(sorted(GATED_TYPES))}",
        )
    if "kv_lora_rank" in config:
        raise SizingError("config", f"{name}: multi-head latent attention (kv_lora_rank, DeepSeek) is not modelled: "
                                    "its KV cache is a compressed latent per token, not K and V per head")
    for key, what in _UNMODELLED_ATTENTION.items():
        if config.get(key):
            raise SizingError("config", f"{name}: {what} ({key}) is not modelled")
    kinds = set(config.get("layer_types") or ()) - {"full_attention", "sliding_attention"}
    if kinds:
        raise SizingError("config", f"{name}: layer_types {', '.join(sorted(map(str, kinds)))} are not modelled "
                                    "(only full_attention and sliding_attention layers)")
    return model_type


# Attention variants whose KV cache or cost the estimator does not model: refused rather than miscounted.
_UNMODELLED_ATTENTION = {
    "attention_chunk_size": "chunked local attention (Llama 4)",
    "linear_attention": "linear attention",
    "linear_num_value_heads": "linear attention (gated delta net)",
    "state_size": "a state-space (Mamba) layer",
    "mamba_d_state": "a state-space (Mamba) layer",
    "ssm_cfg": "a state-space (Mamba) layer",
}


def _sliding_window(config: dict[str, Any], read: _ConfigReader, model_type: str, layers: int) -> tuple[int, int]:
    """(window, layers that use it) from a config: every layer (Mistral, Mixtral), alternating local and global
    layers (Gemma 2: even layers local), a pattern of N (Gemma 3: N-1 local then 1 global), the listed
    `layer_types`, or Qwen2's layers from `max_window_layers` on when `use_sliding_window`; (0, 0) for none."""
    if config.get("sliding_window") is None or config.get("use_sliding_window") is False:
        return 0, 0
    window = read.integer("sliding_window")
    if config.get("layer_types"):
        types = config["layer_types"]
        if not isinstance(types, list) or len(types) != layers:
            raise SizingError("config", f"{read.name}: layer_types must list one type per layer ({layers})")
        sliding = sum(t == "sliding_attention" for t in types)
    elif config.get("sliding_window_pattern") is not None:
        pattern = read.integer("sliding_window_pattern")
        sliding = layers - layers // pattern
    elif model_type == "gemma2":
        sliding = (layers + 1) // 2
    elif config.get("use_sliding_window") and config.get("max_window_layers") is not None:
        sliding = max(layers - read.integer("max_window_layers", minimum=0), 0)
    else:
        sliding = layers
    return (window, sliding) if sliding else (0, 0)


class _ConfigReader:
    """Integers of a config.json, each checked, under the first of its names that is set."""

    def __init__(self, config: dict[str, Any], name: str) -> None:
        self.config, self.name = config, name

    def integer(self, key: str, *alternatives: str, default: int | None = None, minimum: int = 1) -> int:
        for k in (key, *alternatives):
            if self.config.get(k) is not None:
                value = self.config[k]
                if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
                    raise SizingError("config", f"{self.name}: {k} must be an integer >= {minimum}, got {value!r}")
                return value
        if default is None:
            raise SizingError(
                "config", f"{self.name}: missing {key} (not a decoder-only transformer config this estimator reads)")
        return default


def _mixture_of_experts(read: _ConfigReader, experts: int, inter: int) -> dict[str, int]:
    """The MoE fields of an Architecture (none for a dense model, whose MLP must then have a size)."""
    name = read.name
    if not experts:
        if inter == 0:
            raise SizingError("config", f"{name}: intermediate_size must be an integer >= 1, got 0")
        return {}
    if read.integer("decoder_sparse_step", default=1) != 1 or read.config.get("mlp_only_layers"):
        raise SizingError(
            "config", f"{name}: MoE on only some layers (decoder_sparse_step/mlp_only_layers) is not modelled")
    per_token = read.integer("num_experts_per_tok")
    if per_token > experts:
        raise SizingError("config", f"{name}: num_experts_per_tok {per_token} exceeds the {experts} experts")
    return {
        "experts": experts,
        "experts_per_token": per_token,
        "expert_intermediate": read.integer("moe_intermediate_size", default=inter),
        "shared_expert_intermediate": read.integer("shared_expert_intermediate_size", default=0, minimum=0),
    }


def _build_catalogue() -> dict[str, Architecture]:
    return {
        name: from_hf_config(values, name=name, source=f"huggingface.co/{repo}/config.json")
        for name, (repo, values) in _PUBLISHED.items()
    }


CATALOGUE: dict[str, Architecture] = _build_catalogue()
_ALIASES = _aliases()


def catalogue_names() -> list[str]:
    return list(CATALOGUE)


def resolve_model(name: str) -> Architecture:
    """A catalogue model by name ("llama-3-70b"), Hub id ("meta-llama/Meta-Llama-3-70B") or "-instruct" variant."""
    key = name.strip().lower()
    for candidate in (key, key.removesuffix("-instruct"), key.replace("-instruct", "")):
        if candidate in _ALIASES:
            return CATALOGUE[_ALIASES[candidate]]
    raise SizingError("model", f"unknown model {name!r}; known: {', '.join(CATALOGUE)} (or pass a config.json)")


def read_config_file(path: str | Path) -> tuple[dict[str, Any], str]:
    """A config.json file's contents and a label for it (its folder's name, as on the Hub)."""
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    try:
        text = p.read_text()
    except OSError as exc:
        raise SizingError("config", f"cannot read {p}: {exc.strerror or exc}") from None
    try:
        config = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SizingError(
            "config", f"{p} is not valid JSON: {exc.msg} (line {exc.lineno} column {exc.colno})") from None
    label = p.resolve().parent.name if p.name == "config.json" else p.stem
    return config, label


def load_config_file(path: str | Path) -> Architecture:
    """Read and validate a Hugging Face config.json file."""
    config, label = read_config_file(path)
    return from_hf_config(config, name=label, source=str(path))


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)

