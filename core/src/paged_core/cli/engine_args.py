"""Engine and sampling options shared by ``paged generate``, ``chat``, ``serve`` and ``bench``."""

from __future__ import annotations

import argparse
import types
from typing import Any, Union, get_args, get_origin

from paged_core.engine_config import EngineConfig, FlatField, flat_fields
from paged_core.errors import ConfigError
from paged_core.sampling.params import SamplingParams


def add_engine_args(parser: argparse.ArgumentParser) -> None:
    """One flag per :class:`EngineConfig` field (``--max-num-seqs``...), generated from the fields' metadata.

    A field's flag is ``--`` plus its name with dashes unless its metadata
    names another (``--no-prefix-caching``, ``--engine-seed``: ``--seed`` is
    the per-request sampling seed); the help text is the field's. Plus
    ``--enforce-eager``, the same as ``--graph-mode eager``.
    """
    g = parser.add_argument_group("engine")
    for name, leaf in flat_fields().items():
        flag, kwargs = engine_flag(name, leaf)
        g.add_argument(flag, **kwargs)
    g.add_argument("--enforce-eager", action="store_true", help="same as --graph-mode eager")


def engine_flag(name: str, leaf: FlatField) -> tuple[str, dict[str, Any]]:
    """The flag of one field and its ``add_argument`` keywords (``dest`` is the field's name)."""
    f, meta = leaf.field, leaf.field.metadata
    flag = meta.get("flag", "--" + name.replace("_", "-"))
    kwargs: dict[str, Any] = {"dest": _dest(name, flag), "help": meta["help"]}
    if leaf.type is bool:
        # A switch on by default is turned off by its (negative) flag, and vice versa.
        kwargs["action"] = "store_false" if f.default else "store_true"
        return flag, kwargs
    if leaf.type == bool | None:
        # A switch the engine decides unless told: --name turns it on, --no-name off, neither leaves None.
        kwargs["action"], kwargs["default"] = argparse.BooleanOptionalAction, None
        return flag, kwargs
    kinds = [t for t in (get_args(leaf.type) if _is_union(leaf.type) else (leaf.type,)) if t is not type(None)]
    kwargs["default"] = f.default
    if "choices" in meta:
        kwargs["choices"] = meta["choices"]
    if kinds == [int] or kinds == [float]:
        kwargs["type"], kwargs["metavar"] = kinds[0], "N" if kinds == [int] else "X"
    elif kinds and get_origin(kinds[0]) is tuple:
        kwargs["type"], kwargs["metavar"] = _int_list(flag), "N,N,..."
    if "metavar" in meta:
        kwargs["metavar"] = meta["metavar"]
    if f.default is not None:
        kwargs["help"] += f" (default {_show(f.default)})"
    return flag, kwargs


def engine_config_from(args: argparse.Namespace, **overrides: Any) -> EngineConfig:
    """An :class:`EngineConfig` from parsed engine options (``overrides``: flat field names)."""
    flat: dict[str, Any] = {}
    for name, leaf in flat_fields().items():
        _, kwargs = engine_flag(name, leaf)
        flat[name] = getattr(args, kwargs["dest"])
    if getattr(args, "enforce_eager", False):
        if flat["graph_mode"] not in ("auto", "eager"):
            raise ConfigError(f"--enforce-eager contradicts --graph-mode {flat['graph_mode']}; pass one of them")
        flat["graph_mode"] = "eager"
    return EngineConfig.of(**{**flat, **overrides})


def _dest(name: str, flag: str) -> str:
    # A renamed flag keeps its own dest (``--engine-seed`` must not clash with the sampling ``--seed``), except a
    # negative switch, which stores straight into its field.
    return name if flag.startswith("--no-") else flag.removeprefix("--").replace("-", "_")


def _is_union(tp: Any) -> bool:
    return get_origin(tp) in (Union, types.UnionType)


def _show(value: Any) -> str:
    return ",".join(map(str, value)) if isinstance(value, tuple) else str(value)


def _int_list(flag: str) -> Any:
    def parse(text: str) -> tuple[int, ...]:
        try:
            return tuple(int(v) for v in text.split(",") if v.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(f"{flag} must be comma-separated ints, got {text!r}") from None

    parse.__name__ = "comma-separated ints"  # argparse names the type in its error
    return parse


def add_sampling_args(parser: argparse.ArgumentParser, max_tokens: int = 256) -> None:
    """The sampling options, named as in the OpenAI API and vLLM."""
    g = parser.add_argument_group("sampling")
    g.add_argument("--max-tokens", type=int, default=max_tokens, help=f"tokens to generate (default {max_tokens})")
    g.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    g.add_argument("--top-k", type=int, default=0, help="sample from the k most likely tokens (0 = off)")
    g.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass in (0, 1]")
    g.add_argument("--min-p", type=float, default=0.0, help="drop tokens below min_p x the top probability")
    g.add_argument("--repetition-penalty", type=float, default=1.0)
    g.add_argument("--frequency-penalty", type=float, default=0.0)
    g.add_argument("--presence-penalty", type=float, default=0.0)
    g.add_argument("--seed", type=int, default=None, help="per-request seed (reproducible sampling)")
    g.add_argument("--stop", action="append", default=None, help="stop string (repeatable)")
    g.add_argument("--n", type=int, default=1, help="completions per prompt")
    g.add_argument("--ignore-eos", action="store_true", help="keep going past the end-of-sequence token")


def sampling_params_from(args: argparse.Namespace) -> SamplingParams:
    """A :class:`SamplingParams` from parsed sampling options (validated: errors name the option)."""
    return SamplingParams(
        n=args.n,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        min_p=args.min_p,
        repetition_penalty=args.repetition_penalty,
        frequency_penalty=args.frequency_penalty,
        presence_penalty=args.presence_penalty,
        seed=args.seed,
        stop=args.stop,
        max_tokens=args.max_tokens,
        ignore_eos=args.ignore_eos,
    )
