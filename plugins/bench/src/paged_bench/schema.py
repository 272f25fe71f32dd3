"""The report's JSON schema (a small JSON-Schema subset) and a validator for it.

Supported keywords: ``type`` (a name or a list of names), ``required``,
``properties``, ``additionalProperties`` (a schema for the other keys),
``items``, ``enum`` and ``minimum``: enough to pin the report down without
a dependency.
"""

from __future__ import annotations

from typing import Any

Schema = dict[str, Any]

NUM: Schema = {"type": "number", "minimum": 0}
OPT_NUM: Schema = {"type": ["number", "null"], "minimum": 0}
INT: Schema = {"type": "integer", "minimum": 0}
OPT_INT: Schema = {"type": ["integer", "null"], "minimum": 0}
STR: Schema = {"type": "string"}


def _obj(props: dict[str, Schema], nullable: bool = False, **extra: Any) -> Schema:
    """An object requiring every listed property."""
    schema: Schema = {
        "type": ["object", "null"] if nullable else "object",
        "required": list(props),
        "properties": props,
    }
    schema.update(extra)
    return schema


SUMMARY = _obj(
    {"p50": NUM, "p99": NUM, "mean": NUM, "min": NUM, "max": NUM, "values": {"type": "array", "items": NUM}},
    nullable=True,
)

RUN = _obj(
    {
        "name": STR,
        "seconds": NUM,
        "num_requests": INT,
        "prompt_tokens": INT,
        "output_tokens": INT,
        "total_tokens": INT,
        "output_tok_s": NUM,
        "total_tok_s": NUM,
        "ttft_s": SUMMARY,
        "prefill_tokens_computed": {"type": ["integer", "null"]},
        "prefix_hit_rate": OPT_NUM,
        "spec_acceptance_rate": OPT_NUM,
        "spec_mean_accepted_length": OPT_NUM,
        "decode_tok_s": OPT_NUM,
        "steps": OPT_INT,
        "peak_running": OPT_INT,
        "preemptions": OPT_INT,
    }
)
RUN["properties"]["startup_s"] = OPT_NUM
"""Optional (vLLM runs): the engine's start-up seconds, outside the timed run."""

TRACE = _obj(
    {
        "name": STR,
        "steps": INT,
        "utilization": NUM,
        "budget_occupancy": NUM,
        "peak_concurrent": INT,
        "mean_concurrent": NUM,
        "preemptions": INT,
        "series_stride": INT,
        "series": _obj(
            {
                "step": {"type": "array", "items": INT},
                "utilization": {"type": "array", "items": NUM},
                "running": {"type": "array", "items": INT},
            }
        ),
    }
)

ROOFLINE: Schema = {
    "type": ["object", "null"],
    "required": ["kind", "fraction"],
    "properties": {
        "kind": {"type": "string", "enum": ["flops", "bandwidth"]},
        "fraction": NUM,
        "peak_flops_per_s": NUM,
        "achieved_flops_per_s": NUM,
        "peak_bytes_per_s": NUM,
        "achieved_bytes_per_s": NUM,
    },
}
"""A roofline has either the FLOP pair or the byte pair; :func:`validate_report` checks which."""
RUN["properties"]["roofline"] = ROOFLINE
"""Optional (llama.cpp runs): the run's own bandwidth roofline, for a system reading other weight bytes than ours."""
RUN["properties"]["llama_cpp"] = {"type": ["object", "null"]}
"""Optional (llama.cpp runs): what llama-bench reported (build, model type, threads, spread)."""
RUN["properties"]["structured"] = _obj(
    {
        "mask_steps": INT,
        "mask_rows": INT,
        "mask_seconds": NUM,
        "mask_s_per_step": OPT_NUM,
        "rows_per_step": OPT_NUM,
        "compiles": INT,
        "compile_s": SUMMARY,
        "finish_reasons": {"type": "object", "additionalProperties": INT},
        "valid_json": INT,
        "output_lens": {"type": "array", "items": INT},
    }
)
"""Optional (the ``--constrained`` run): the engine's grammar figures over the run (see ``engine_run``)."""
RUN["properties"]["lora"] = _obj(
    {
        "adapters": INT,
        "rank": INT,
        "targets": {"type": "array", "items": STR},
        "assignment": {"type": "string", "enum": ["round-robin"]},
        "max_loras": INT,
        "max_lora_rank": INT,
        "slot_loads": INT,
    }
)
"""Optional (the ``--lora N`` run): its adapters, how requests were spread, and adapter copies into device slots
while timed (0 when all fit: ``max_loras >= adapters``; see ``lora_run``)."""

REPORT = _obj(
    {
        "schema_version": {"type": "integer", "enum": [1]},
        "workload": {"type": "string", "enum": ["throughput", "prefix", "kv-util", "decode-1", "edit-1", "long"]},
        "created": STR,
        "command": {"type": "array", "items": STR},
        "config": _obj(
            {
                "workload": STR,
                "baselines": {"type": "array", "items": STR},
                "num_requests": OPT_INT,
                "output_len": OPT_INT,
                "seed": {"type": "integer"},
                "hf_batch": INT,
                "engine": {"type": "object"},
                "kv_util": {"type": ["object", "null"]},
            }
        ),
        "engine": {"type": ["object", "null"]},
        "model": {"type": ["object", "null"]},
        "machine": _obj(
            {
                "cpu_model": STR,
                "logical_cores": OPT_INT,
                "physical_cores": OPT_INT,
                "torch_threads": INT,
                "memory_gib": NUM,
                "platform": STR,
                "python": STR,
                "device": STR,
                "accelerator": {"type": ["string", "null"]},
                "versions": {"type": "object", "additionalProperties": {"type": ["string", "null"]}},
            }
        ),
        "workload_stats": _obj(
            {
                "num_requests": INT,
                "prompt_tokens": INT,
                "output_tokens": INT,
                "prompt_len": {"type": "object"},
                "output_len": {"type": "object"},
            }
        ),
        "runs": {"type": "array", "items": RUN},
        "ratios": {"type": "object", "additionalProperties": NUM},
        "roofline": ROOFLINE,
        "kv_util": _obj(
            {"paged": TRACE, "reserved": TRACE, "utilization": NUM, "peak_concurrency_ratio": NUM}, nullable=True
        ),
        "goals": {
            "type": "array",
            "items": _obj(
                {"goal": STR, "figure": STR, "target": NUM, "value": OPT_NUM, "met": {"type": ["boolean", "null"]}}
            ),
        },
    }
)

REPORT["properties"]["config"]["properties"]["lora"] = _obj({"adapters": INT, "rank": INT}, nullable=True)
"""Optional (reports before ``--lora`` lack it): the ``--lora`` adapters asked for, or null."""
REPORT["properties"]["config"]["properties"]["kv_dtypes"] = {"type": "array", "items": STR}
"""Optional (reports before ``--kv-dtypes`` lack it): the other KV dtypes asked for."""

KV_DTYPE_FIGURES: dict[str, dict[str, Schema]] = {
    "throughput": {"run": STR, "output_tok_s": NUM, "nll": OPT_NUM},
    "kv-util": {"slots": INT, "peak_concurrent": INT, "mean_concurrent": NUM, "utilization": NUM, "preemptions": INT},
}
"""What each ``kv_dtypes`` entry holds beside its cache, by workload."""
KV_DTYPE_ENTRY = _obj({"name": STR, "kv_dtype": STR, "backend": STR, "bytes_per_block": INT, "num_blocks": INT})
for _figures in KV_DTYPE_FIGURES.values():
    KV_DTYPE_ENTRY["properties"].update(_figures)
REPORT["properties"]["kv_dtypes"] = _obj(
    {
        "workload": {"type": "string", "enum": list(KV_DTYPE_FIGURES)},
        "baseline": STR,
        "entries": {"type": "array", "items": KV_DTYPE_ENTRY},
        "ratios": {"type": "object", "additionalProperties": NUM},
    },
    nullable=True,
)
REPORT["properties"]["kv_dtypes"]["properties"].update(
    {"nll_text": {"type": ["string", "null"]}, "nll_tokens": OPT_INT, "budget_bytes": INT}
)
"""Optional (``--kv-dtypes``; reports before it lack the key): one entry per KV dtype, ours first, and the ratios
(see ``paged_bench.kv_dtypes``)."""

_TYPES: dict[str, tuple[type, ...]] = {
    "object": (dict,),
    "array": (list,),
    "string": (str,),
    "boolean": (bool,),
    "null": (type(None),),
    "integer": (int,),
    "number": (int, float),
}


def _is(value: Any, name: str) -> bool:
    if name in ("integer", "number") and isinstance(value, bool):
        return False  # JSON booleans are not numbers
    return isinstance(value, _TYPES[name])


def validate(value: Any, schema: Schema, path: str = "$") -> list[str]:
    """Every way ``value`` breaks ``schema``, as ``"path: problem"`` strings (empty when valid)."""
    names = schema.get("type")
    if names is not None:
        names = [names] if isinstance(names, str) else names
        if not any(_is(value, n) for n in names):
            return [f"{path}: expected {' or '.join(names)}, got {type(value).__name__}"]
    errors: list[str] = []
    if "enum" in schema and value not in schema["enum"]:
        errors.append(f"{path}: {value!r} is not one of {schema['enum']}")
    if "minimum" in schema and _is(value, "number") and value < schema["minimum"]:
        errors.append(f"{path}: {value} is below the minimum {schema['minimum']}")
    if isinstance(value, dict):
        props = schema.get("properties", {})
        errors += [f"{path}: missing {key!r}" for key in schema.get("required", []) if key not in value]
        for key, item in value.items():
            sub = props.get(key, schema.get("additionalProperties"))
            if sub is not None:
                errors += validate(item, sub, f"{path}.{key}")
    if isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            errors += validate(item, schema["items"], f"{path}[{i}]")
    return errors


def validate_report(report: Any) -> list[str]:
    """Schema errors of a report, plus the cross-field rules the schema cannot say."""
    errors = validate(report, REPORT)
    if errors:
        return errors
    rooflines = [("$.roofline", report["roofline"])]
    rooflines += [(f"$.runs[{i}].roofline", run.get("roofline")) for i, run in enumerate(report["runs"])]
    for path, roof in rooflines:
        if roof is None:
            continue
        pair = (
            ("peak_flops_per_s", "achieved_flops_per_s")
            if roof["kind"] == "flops"
            else ("peak_bytes_per_s", "achieved_bytes_per_s")
        )
        errors += [f"{path}: {roof['kind']} roofline lacks {k!r}" for k in pair if k not in roof]
    if report["workload"] == "kv-util" and report["kv_util"] is None:
        errors.append("$.kv_util: the kv-util workload must report its traces")
    if report["workload"] != "kv-util" and not report["runs"]:
        errors.append("$.runs: a model workload must report at least our own run")
    kv = report.get("kv_dtypes")
    if kv is not None:
        for i, entry in enumerate(kv["entries"]):
            missing = [k for k in KV_DTYPE_FIGURES[kv["workload"]] if k not in entry]
            errors += [f"$.kv_dtypes.entries[{i}]: missing {k!r}" for k in missing]
    return errors
