"""Workload sizing: memory, time and GPU recommendations for LLM serving and fine-tuning.

A pure core, no I/O beyond reading the packaged data files: `estimate(request)`
takes a `SizingRequest` and returns a `SizingReport`. The CLI (`whaleflux size`)
and the scheduler's `POST /v1/size` are thin shells around it.

- `architectures`: the built-in catalogue and Hugging Face config.json parsing;
  parameter counts computed from the architecture.
- `memory`: the memory line items, per GPU under tensor/pipeline/data-parallel splits.
- `throughput`: training time from FLOPs, serving tokens/s from memory bandwidth.
- `recommend`: every feasible (GPU model, count, split), ranked by cost and by time.
"""

from .architectures import (
    CATALOGUE,
    Architecture,
    catalogue_names,
    from_hf_config,
    load_config_file,
    read_config_file,
    resolve_model,
)
from .errors import SizingError
from .recommend import SizingReport, estimate, memory_floor_mib, reference_prices
from .request import SizingRequest

__all__ = [
    "CATALOGUE",
    "Architecture",
    "SizingError",
    "SizingReport",
    "SizingRequest",
    "catalogue_names",
    "estimate",
    "from_hf_config",
    "load_config_file",
    "memory_floor_mib",
    "read_config_file",
    "reference_prices",
    "resolve_model",
]
