"""Reading checkpoints: our own self-describing files (``HydraViT.save`` writes them), the official HydraViT
release and timm/DeiT layouts.

Loading is a pure filter (timm's ``checkpoint_filter_fn`` habit): unwrap the container, strip
prefixes, check every key and shape against the model, and only then copy, so a bad file never
leaves a half-loaded model behind.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import Any, Mapping

import torch

from ..errors import CheckpointError
from ..records import codec
from ..records.manifest import ClassNames, class_names_problem
from .config import HydraConfig
from .hydravit import FORMAT_KEY, HydraViT
from .slicing import subnetwork_name, weight_index

EMA_ENTRIES = ("state_dict_ema", "model_ema")  # timm / official HydraViT release; DeiT
PLAIN_ENTRIES = ("state_dict", "model", "module")
TOP_LEVEL = "top level"  # a file that is itself a state dict
_PREFIXES = ("module.", "_orig_mod.")  # DDP and torch.compile wrappers
_log = logging.getLogger(__name__)  # the note goes to stderr even when nothing configured logging


def read_file(path: str | Path) -> dict[str, Any]:
    """Read a checkpoint file without executing code (weights_only), or fail with one line."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path} does not exist")
    try:
        # timm training checkpoints carry their argparse namespace under 'args'.
        with torch.serialization.safe_globals([argparse.Namespace]):
            obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # torch raises many types for a non-checkpoint; all mean the same here
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CheckpointError(f"{path} is not a PyTorch checkpoint ({reason[:120]})") from None
    if not isinstance(obj, dict):
        raise CheckpointError(f"{path} holds a {type(obj).__name__}, not a checkpoint dictionary")
    return obj

def weights_entry(obj: Mapping[str, Any], ema: bool = True) -> str:
    """Which entry of a checkpoint file holds the weights to load; ``TOP_LEVEL`` for a bare state dict.

    With ``ema``, the first EMA entry the file has (timm's and the official release's
    ``state_dict_ema``, DeiT's ``model_ema``): those are the weights the paper evaluates.
    Otherwise, or when the file has none, the first of ``state_dict`` / ``model`` / ``module``.
    """
    keys = (EMA_ENTRIES if ema else ()) + PLAIN_ENTRIES
    return next((key for key in keys if key in obj), TOP_LEVEL)


def state_dict_of(obj: Mapping[str, Any], path: str | Path, ema: bool = True) -> dict[str, torch.Tensor]:
    """The weights ``weights_entry`` picks, unwrapped, with DDP / torch.compile prefixes stripped.

    A file asked for EMA weights that has none falls back to its plain weights with a note (hydra-edge's
    own files trained without EMA pass quietly); an EMA entry that is not a state dict fails.
    """
    key = weights_entry(obj, ema)
    entry = obj if key == TOP_LEVEL else obj[key]
    if key != TOP_LEVEL and not (isinstance(entry, Mapping)
                                 and any(isinstance(v, torch.Tensor) for v in entry.values())):
        hint = "; pass --no-ema to load its plain weights" if key in EMA_ENTRIES else ""
        raise CheckpointError(f"{path}: '{key}' holds a {type(entry).__name__} without tensors, not a state dict{hint}")
    state = {}
    for name, value in entry.items():
        if not isinstance(value, torch.Tensor):
            continue
        for prefix in _PREFIXES:
            if name.startswith(prefix):
                name = name[len(prefix):]
        state[name] = value
    if "patch_embed.proj.weight" not in state:
        raise CheckpointError(
            f"{path} is not a ViT checkpoint: no 'patch_embed.proj.weight' in it "
            "(expected a hydra-edge, official HydraViT or timm/DeiT file)"
        )
    if ema and key not in EMA_ENTRIES and FORMAT_KEY not in obj:
        _log.warning("note: %s has no EMA weights (%s); loading its %s", path, " or ".join(EMA_ENTRIES),
                     "top-level weights" if key == TOP_LEVEL else f"'{key}' weights")
    return state


def infer_config(state: Mapping[str, torch.Tensor], path: str | Path, head_dim: int = 64) -> HydraConfig:
    """Rebuild the config of a foreign (timm/DeiT/official HydraViT) checkpoint from its shapes."""
    try:
        D, C, P, _ = state["patch_embed.proj.weight"].shape
        tokens = state["pos_embed"].shape[1]
        depth = 1 + max(int(n.split(".")[1]) for n in state if n.startswith("blocks."))
        mlp_ratio = state["blocks.0.mlp.fc1.weight"].shape[0] // D
        num_classes = state["head.weight"].shape[0]
    except (KeyError, ValueError) as e:
        raise CheckpointError(f"{path} is missing key {e} needed to read the model's shape") from None
    grid = round((tokens - 1) ** 0.5)
    if D % head_dim or grid * grid != tokens - 1:
        raise CheckpointError(
            f"{path}: width {D} and {tokens} tokens do not fit a ViT with heads of {head_dim} and a cls token"
        )
    num_heads = D // head_dim
    return HydraConfig(
        img_size=grid * P, patch_size=P, in_chans=C, num_classes=num_classes, depth=depth,
        num_heads=num_heads, head_dim=head_dim, mlp_ratio=mlp_ratio,
        heads=tuple(range(min(3, num_heads), num_heads + 1)),
    )


def _check(expected: Mapping[str, torch.Size], state: Mapping[str, torch.Tensor], path: str | Path) -> None:
    """Fail on the first missing, misshapen or unexpected key, naming it."""
    for name, shape in expected.items():
        if name not in state:
            raise CheckpointError(f"{path} lacks key {name!r} (expected shape {tuple(shape)})")
        if state[name].shape != shape:
            raise CheckpointError(
                f"{path}: key {name!r} has shape {tuple(state[name].shape)}, the model expects {tuple(shape)}"
            )
    extra = [n for n in state if n not in expected]
    if extra:
        raise CheckpointError(f"{path} has key {extra[0]!r} that this model does not have (a distilled DeiT?)")


def load_state(model: HydraViT, state: Mapping[str, torch.Tensor], path: str | Path = "<state>") -> None:
    """Copy a full-width state dict into ``model`` after checking all of it."""
    params = dict(model.named_parameters())
    _check({n: p.shape for n, p in params.items()}, state, path)
    with torch.no_grad():
        for name, param in params.items():
            param.copy_(state[name])


def load_checkpoint(path: str | Path, ema: bool = True, head_dim: int = 64) -> HydraViT:
    """Load any supported checkpoint into a new ``HydraViT``.

    Our own files carry their config; foreign ones (official release, timm, DeiT) are read by
    shape with ``head_dim`` per head (64 for the ViT-B family). ``ema``: the EMA weights when the
    file has them (``weights_entry``), as the release is evaluated.
    """
    return load_checkpoint_file(path, ema, head_dim)[0]


def load_checkpoint_file(path: str | Path, ema: bool = True,
                         head_dim: int = 64) -> tuple[HydraViT, dict[str, Any]]:
    """``load_checkpoint`` plus the whole file (data spec, training state), read once: a b16 file is 330 MB."""
    obj = read_file(path)
    state = state_dict_of(obj, path, ema=ema)
    if isinstance(obj.get("config"), Mapping):
        cfg = HydraConfig.from_dict(dict(obj["config"]), f"{path} config")
    else:
        cfg = infer_config(state, path, head_dim)
    model = HydraViT(cfg)
    load_state(model, state, f"{path} ['{weights_entry(obj, ema)}']")
    # In evaluation mode, as a loaded model is mostly used: the training forward (fused attention,
    # drop path) equals it only to float rounding. Training switches itself back with .train().
    return model.eval(), obj


def checkpoint_classes(obj: Mapping[str, Any], path: str | Path, num_classes: int) -> list[str] | None:
    """The class names a hydra-edge checkpoint carries (its ``classes`` entry), in logit order, checked:
    non-empty, each once, one per output of its classifier (``num_classes``). None for a file without
    them: foreign layouts (timm, DeiT, the release), or ours from before names were kept."""
    if FORMAT_KEY not in obj or obj.get("classes") is None:
        return None
    where = f"{path} ['classes']"
    hint = "save it again with one name per class, or without a 'classes' entry"
    names = codec.convert(obj["classes"], ClassNames, where, hint)
    problem = class_names_problem(names, num_classes)
    if problem:
        raise CheckpointError(f"{where}: {problem}; {hint}")
    return names


def init_heads_from(model: HydraViT, path: str | Path, ema: bool = True) -> int:
    """Initialise the first heads of ``model`` from a narrower ViT (DeiT-tiny fills heads 1-3).

    Every parameter's slice for k heads (``slicing.weight_index``) is overwritten by the narrow
    checkpoint's tensor; the rest of the model keeps its weights. Returns k.
    """
    return copy_first_heads(model, state_dict_of(read_file(path), path, ema=ema), path)


def copy_first_heads(model: HydraViT, state: Mapping[str, torch.Tensor], path: str | Path,
                     classifier: bool = True) -> int:
    """``init_heads_from`` on a state dict already read; without ``classifier`` the model keeps its own
    classifier(s) and the narrow one's may have any number of classes (a new set of classes). Returns k."""
    width = state["cls_token"].shape[-1] if "cls_token" in state else -1
    k, rest = divmod(width, model.config.head_dim)
    if rest or not 1 <= k <= model.config.num_heads:
        raise CheckpointError(
            f"{path}: width {width} is not a whole number of {model.config.head_dim}-wide heads "
            f"up to {model.config.num_heads}"
        )
    targets = {}
    for name, param in model.named_parameters():
        sub = subnetwork_name(name, k)
        if sub is not None and (classifier or not sub.startswith("head.")):
            targets[sub] = (param, weight_index(name, model.config, k))
    expected = {sub: param[idx].shape for sub, (param, idx) in targets.items()}
    _check(expected, {n: t for n, t in state.items() if classifier or not n.startswith("head.")}, path)
    with torch.no_grad():
        for sub, (param, idx) in targets.items():
            param[idx] = state[sub].to(param.dtype)
    return k
