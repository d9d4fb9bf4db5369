"""A trained model reaches the user's classes: a new classifier on the kept backbone, said in one line; the class
names travel with the model (checkpoint, manifest, lookup tables); a folder of images is checked up front."""

from __future__ import annotations

import argparse
import json
import logging
import subprocess
from pathlib import Path

import msgspec
import numpy as np
import pytest
import torch
from click.testing import CliRunner
from PIL import Image
from support.tables import ODD_NAMES, table_with_classes

from hydra_edge import HydraEdgeError, HydraViT
from hydra_edge.cli import main
from hydra_edge.model.checkpoint import checkpoint_classes, load_checkpoint_file
from hydra_edge.model.config import HydraConfig, preset
from hydra_edge.model.vit import VisionTransformer
from hydra_edge.train.data import DataSpec, data_classes, load_data
from hydra_edge.train.transfer import fit_classes, init_first_heads

PETS = ["cat", "dog", "fox", "owl"]


def _images(root: Path, counts: dict[str, int], size: tuple[int, int] = (12, 10)) -> Path:
    """One sub-folder per class, each class its own shade, so a class is learnable and a mix-up visible."""
    rng = np.random.default_rng(0)
    for c, (name, n) in enumerate(counts.items()):
        (root / name).mkdir(parents=True, exist_ok=True)
        for i in range(n):
            pixels = np.full((*size, 3), 40 * c, np.uint8) + rng.integers(0, 30, (*size, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(root / name / f"{i}.png")
    return root


def _backbone(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: t.clone() for n, t in model.state_dict().items() if not n.startswith(("head.", "heads."))}


def _classifiers(model: HydraViT) -> list[torch.nn.Linear]:
    return [model.heads[str(k)] for k in model.config.heads] if model.config.separate_heads else [model.head]


def _foreign_files(tmp_path: Path, cfg: HydraConfig) -> dict[str, Path]:
    """One model in the layouts of the official release (timm's saver: DDP prefix, EMA, args), DeiT and timm."""
    torch.manual_seed(1)
    state = HydraViT(cfg).state_dict()
    args = argparse.Namespace(lr=5e-4)
    files = {"release": {"epoch": 299, "args": args, "state_dict": {f"module.{k}": v for k, v in state.items()},
                         "state_dict_ema": state, "version": 2},
             "deit": {"model": state, "model_ema": state, "optimizer": {}, "epoch": 299, "args": args},
             "timm": {"epoch": 9, "arch": "vit_base_patch16_224", "args": args, "state_dict": state}}
    for name, obj in files.items():
        torch.save(obj, tmp_path / f"{name}.pth.tar")
    return {name: tmp_path / f"{name}.pth.tar" for name in files}


# --- a new classifier on the kept backbone ------------------------------------------------------------------


@pytest.mark.parametrize("separate", [False, True])
@pytest.mark.parametrize("classes", [PETS, [f"kind {i}" for i in range(17)]], ids=["fewer", "more"])
def test_our_checkpoint_gets_a_classifier_for_the_datas_classes_and_keeps_its_backbone(tmp_path, separate, classes):
    torch.manual_seed(0)
    trained = HydraViT(preset("digits", heads=(3, 6, 12), separate_heads=separate))
    trained.save(tmp_path / "digits.pt", classes=[str(d) for d in range(10)])
    model, saved = load_checkpoint_file(tmp_path / "digits.pt")
    backbone, old = _backbone(model), [c.weight.clone() for c in _classifiers(model)]
    note = fit_classes(model, classes, checkpoint_classes(saved, tmp_path / "digits.pt", 10), tmp_path / "digits.pt")
    assert note.startswith(f"new classifier for {len(classes)} classes ('{classes[0]}', '{classes[1]}', ")
    assert note.endswith(f"on the backbone of {tmp_path / 'digits.pt'}; it had 10 classes ('0', '1', '2', '3', '4', ...)")
    assert "\n" not in note
    assert model.config.num_classes == len(classes)
    assert all(torch.equal(t, backbone[n]) for n, t in _backbone(model).items())
    for layer, was, k in zip(_classifiers(model), old, model.config.heads if separate else [12]):
        assert layer.weight.shape == (len(classes), 8 * k) and not torch.equal(layer.weight[:4], was[:4])
        assert torch.count_nonzero(layer.bias) == 0 and 0.01 < layer.weight.std() < 0.03
    x = torch.randn(2, 1, 8, 8)
    assert all(model(x, heads=k).shape == (2, len(classes)) for k in (3, 6, 12))


@pytest.mark.parametrize("layout", ["release", "deit", "timm"])
def test_foreign_checkpoints_get_a_classifier_for_a_folders_classes(tmp_path, b16_like, layout):
    """The official release, DeiT and timm files carry no class names: their count decides."""
    path = _foreign_files(tmp_path, b16_like)[layout]
    folder = _images(tmp_path / "pets", dict.fromkeys(PETS, 5), size=(40, 36))
    model, saved = load_checkpoint_file(path)
    assert checkpoint_classes(saved, path, model.config.num_classes) is None
    with pytest.raises(HydraEdgeError, match="has 4 classes but the model has 10; .*fine-tune it on this data"):
        load_data(str(folder), model.config)  # no transfer asked: the mismatch is one clear line
    backbone = _backbone(model)
    note = fit_classes(model, data_classes(str(folder)), None, path)
    assert note == f"new classifier for 4 classes ('cat', 'dog', 'fox', 'owl') on the backbone of {path}; it had 10 classes"
    assert all(torch.equal(t, backbone[n]) for n, t in _backbone(model).items())
    split = load_data(str(folder), model.config)
    assert split.classes == PETS and model(split.val[0][0][None], heads=3).shape == (1, 4)


def test_the_same_classes_keep_the_classifier_and_other_names_replace_it_with_a_note(tmp_path, digits_model):
    names = [str(d) for d in range(10)]
    digits_model.save(tmp_path / "m.pt", classes=names)
    model, saved = load_checkpoint_file(tmp_path / "m.pt")
    head = model.head.weight.clone()
    assert fit_classes(model, names, checkpoint_classes(saved, tmp_path / "m.pt", 10), "m.pt") is None
    assert fit_classes(model, [f"x{d}" for d in range(10)], None, "m.pt") is None  # names unknown: the count decides
    assert torch.equal(model.head.weight, head)
    letters = list("abcdefghij")
    note = fit_classes(model, letters, names, "m.pt")
    assert note == ("new classifier for 10 classes ('a', 'b', 'c', 'd', 'e', ...) on the backbone of m.pt; "
                    "it had 10 classes ('0', '1', '2', '3', '4', ...)")
    assert not torch.equal(model.head.weight, head) and model.config.num_classes == 10


def test_a_checkpoints_class_names_are_checked(tmp_path, digits_model):
    names = [str(d) for d in range(10)]
    for entry, message in [(names[:9], r"\['classes'\]: 9 class names for a classifier of 10 classes"),
                           (names[:9] + ["3"], r"\['classes'\]: class name '3' appears twice \(classes 3 and 9\)"),
                           (names[:9] + [""], r"\['classes'\]: \$\[9\]: expected `str` of length >= 1; save it again with one name per class"),
                           ("0123456789", r"\['classes'\]: \$: expected `array`, got `str`")]:
        digits_model.save(tmp_path / "m.pt", classes=entry)
        _, saved = load_checkpoint_file(tmp_path / "m.pt")
        with pytest.raises(HydraEdgeError, match=message) as e:
            checkpoint_classes(saved, tmp_path / "m.pt", 10)
        assert "\n" not in str(e.value)
    # a foreign file's keys are not ours to read: no names, whatever it holds
    torch.save({"model": digits_model.state_dict(), "classes": "not names"}, tmp_path / "deit.pth")
    assert checkpoint_classes(torch.load(tmp_path / "deit.pth", weights_only=True), tmp_path / "deit.pth", 10) is None


def _deit_tiny(b16_like: HydraConfig, num_classes: int) -> VisionTransformer:
    torch.manual_seed(2)
    tiny = VisionTransformer(msgspec.structs.replace(b16_like.narrowed(3), num_classes=num_classes))
    tiny.init_weights()
    return tiny


def test_init_from_deit_tiny_takes_its_backbone_and_not_a_classifier_of_other_classes(tmp_path, b16_like):
    """The paper's start: heads 1-3 from DeiT-tiny, whose ImageNet classifier must not land on a 4-class model."""
    tiny = _deit_tiny(b16_like, num_classes=7)
    torch.save({"model": tiny.state_dict(), "model_ema": tiny.state_dict()}, tmp_path / "deit_tiny.pth")
    model = HydraViT(msgspec.structs.replace(b16_like, num_classes=4))
    head = model.head.weight.clone()
    note = init_first_heads(model, tmp_path / "deit_tiny.pth", PETS)
    assert note == (f"initialised heads 1-3 from {tmp_path / 'deit_tiny.pth'}, its backbone only: a new classifier "
                    "for 4 classes ('cat', 'dog', 'fox', 'owl'); it had 7 classes")
    assert torch.equal(model.head.weight, head)
    sub, theirs = model.subnetwork(3).state_dict(), tiny.state_dict()
    assert all(torch.equal(sub[n], theirs[n]) for n in theirs if not n.startswith("head."))


def test_init_from_a_narrow_model_of_the_same_classes_takes_its_classifier_too(tmp_path, b16_like):
    tiny = _deit_tiny(b16_like, num_classes=4)
    torch.save({"model": tiny.state_dict()}, tmp_path / "tiny.pth")
    model = HydraViT(msgspec.structs.replace(b16_like, num_classes=4))
    assert init_first_heads(model, tmp_path / "tiny.pth", PETS) == f"initialised heads 1-3 from {tmp_path / 'tiny.pth'}"
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert (model(x, heads=3) - tiny(x)).abs().max() <= 1e-5
    # our own narrow file names its classes: four others are not these four
    narrow = HydraViT(msgspec.structs.replace(b16_like.narrowed(3), num_classes=4))
    narrow.save(tmp_path / "narrow.pt", classes=["a", "b", "c", "d"])
    note = init_first_heads(model, tmp_path / "narrow.pt", PETS)
    assert note.endswith("its backbone only: a new classifier for 4 classes ('cat', 'dog', 'fox', 'owl'); "
                         "it had 4 classes ('a', 'b', 'c', 'd')")


# --- class names travel: manifest, lut.json, C and Kotlin -----------------------------------------------------

def test_convert_takes_the_checkpoints_class_names_else_its_datas(tmp_path, b16_like):
    from hydra_edge.convert.inputs import check_inputs
    from hydra_edge.convert.options import ConvertOptions
    from hydra_edge.convert.plan import plan

    def manifest_classes(saved: dict, data: str | None = None) -> list[str] | None:
        torch.save(saved, tmp_path / "m.pt")
        opts = ConvertOptions(checkpoint=tmp_path / "m.pt", target="jetson", out=tmp_path / "b", heads="3", data=data)
        return plan(opts, check_inputs(opts)).manifest.classes

    model = HydraViT(msgspec.structs.replace(b16_like, num_classes=len(ODD_NAMES)))
    own = {"hydra_edge": 1, "config": model.config.to_dict(), "state_dict": model.state_dict()}
    assert manifest_classes({**own, "classes": ODD_NAMES}) == ODD_NAMES
    assert manifest_classes(own) is None  # nothing says: the device shows indices
    folder = _images(tmp_path / "pets", dict.fromkeys(PETS, 5), size=(40, 36))
    pets = HydraViT(msgspec.structs.replace(b16_like, num_classes=4))
    own = {"hydra_edge": 1, "config": pets.config.to_dict(), "state_dict": pets.state_dict()}
    assert manifest_classes({**own, "data": DataSpec(str(folder)).to_dict()}) == PETS
    with pytest.raises(HydraEdgeError, match=r"pets's classes are not the model's: class 0 is 'cat' there and 'a'"):
        manifest_classes({**own, "classes": list("abcd")}, data=str(folder))


def test_lut_json_carries_the_class_names_and_refuses_repeated_ones(tmp_path):
    from hydra_edge.records import lut as record

    doc = table_with_classes(tmp_path, ODD_NAMES)
    assert record.decode(record.encode(doc, "lut.json"), "lut.json").classes == ODD_NAMES
    assert record.decode(record.encode(table_with_classes(tmp_path / "none", None), "lut.json"), "lut.json").classes is None
    with pytest.raises(HydraEdgeError, match=r"lut.json: \$.classes: class name 'plain' appears twice"):
        record.decode(json.dumps({**doc, "classes": ["plain", "plain"]}), "lut.json")


def test_the_c_header_names_the_classes_byte_for_byte(tmp_path):
    """Compiled with the warnings a careful app uses; names with quotes, backslashes, trigraphs, UTF-8 and tabs."""
    from hydra_edge.lut.emit_c import emit_c

    (tmp_path / "hydra_lut.h").write_text(emit_c(table_with_classes(tmp_path, ODD_NAMES)))
    (tmp_path / "main.c").write_text('#include <stdio.h>\n#include "hydra_lut.h"\nint main(void) {\n'
                                     '    for (int i = 0; i < HYDRA_LUT_CLASSES; i++) printf("%s\\n", hydra_lut_classes[i]);\n'
                                     "    return 0;\n}\n")
    subprocess.run(["gcc", "-std=c99", "-trigraphs", "-Wall", "-Wextra", "-Werror", "-o", "names", "main.c"],
                   check=True, cwd=tmp_path)
    assert subprocess.run([str(tmp_path / "names")], capture_output=True, check=True).stdout.decode() == \
        "".join(f"{n}\n" for n in ODD_NAMES)
    names = [line for line in (tmp_path / "hydra_lut.h").read_text().splitlines() if line.startswith("static const char")]
    assert len(names) == 1 and names[0].isascii()  # whatever encoding the app's compiler assumes
    unnamed = emit_c(table_with_classes(tmp_path / "none", None))
    assert "#define HYDRA_LUT_CLASSES 0\n" in unnamed and "const char" not in unnamed


# --- the input a model takes, for the user ---------------------------------------------------------------------


def test_info_prints_input_size_channels_and_classes(tmp_path, digits_model):
    digits_model.save(tmp_path / "named.pt", classes=[f"digit {d}" for d in range(10)])
    digits_model.save(tmp_path / "unnamed.pt")
    out = {name: CliRunner().invoke(main, ["info", "--checkpoint", str(tmp_path / f"{name}.pt")])
           for name in ("named", "unnamed")}
    assert all(r.exit_code == 0 for r in out.values()), out
    assert out["named"].output.splitlines()[0] == "input 8x8 px grayscale; 10 classes ('digit 0', 'digit 1', " \
                                                  "'digit 2', 'digit 3', 'digit 4', 'digit 5', 'digit 6', 'digit 7', " \
                                                  "'digit 8', 'digit 9')"
    assert out["unnamed"].output.splitlines()[0] == "input 8x8 px grayscale; 10 classes (names unknown)"
    mini = CliRunner().invoke(main, ["info", "--preset", "mini"])
    assert mini.exit_code == 0 and mini.output.startswith("input 64x64 px RGB;")


def test_the_mini_preset_is_a_colour_model_whose_head_counts_mean_what_b16s_do():
    mini, b16 = preset("mini"), preset("b16")
    assert (mini.in_chans, mini.num_heads, mini.heads) == (3, 12, b16.heads)
    assert mini.num_patches < b16.num_patches and mini.embed_dim < b16.embed_dim


# --- a folder of images, checked up front --------------------------------------------------------------------


def test_unreadable_and_truncated_images_are_skipped_with_one_warning_each(tmp_path, caplog):
    folder = _images(tmp_path / "pets", {"cat": 6, "dog": 6})
    (folder / "cat" / "notes.png").write_text("not an image")
    data = (folder / "dog" / "0.png").read_bytes()
    (folder / "dog" / "0.png").write_bytes(data[: len(data) // 2])
    (folder / "dog" / ".hidden").mkdir()
    (folder / "dog" / ".hidden" / "x.png").write_text("inside a hidden folder: not a training image")
    (folder / ".ipynb_checkpoints").mkdir()  # a notebook's folder is no class
    cfg = preset("digits", num_classes=2)
    with caplog.at_level(logging.WARNING, logger="hydra_edge.train.data"):
        split = load_data(str(folder), cfg)
    messages = sorted(r.getMessage() for r in caplog.records)
    assert len(messages) == 2 and all(m.startswith("warning: skipped cannot read image ") for m in messages)
    assert "notes.png" in messages[0] + messages[1] and str(folder / "dog" / "0.png") in messages[0] + messages[1]
    assert split.classes == ["cat", "dog"] and len(split.train) + len(split.val) == 11
    assert all(x.shape == (1, 8, 8) for x, _ in (split.train[i] for i in range(len(split.train))))


def _bad_folder(tmp_path: Path, case: str) -> Path:
    root = tmp_path / "data"
    if case == "one class":
        _images(root, {"cat": 6})
    elif case == "empty class":
        _images(root, {"cat": 6, "dog": 6})
        (root / "fox").mkdir()
    elif case == "only unreadable images":
        _images(root, {"cat": 6, "dog": 6})
        (root / "fox").mkdir()
        (root / "fox" / "a.jpg").write_bytes(b"\xff\xd8\xff")
    elif case == "case":
        _images(root, {"Cat": 6, "cat": 6})
    elif case == "unicode form":
        _images(root, {"ﬁsh": 6, "fish": 6})  # the ligature ﬁ is fi in NFKC
    elif case == "spaces":
        _images(root, {"dog": 6, "dog ": 6})
    elif case == "val class not in train":
        _images(root / "train", {"cat": 6, "dog": 6})
        _images(root / "val", {"cat": 2, "cow": 2})
    return root


BAD_FOLDERS = {
    "one class": r"data has one class folder \('cat'\); a classifier needs two classes or more",
    "empty class": r"class folder .*fox holds no readable images .*; add images to it or remove it",
    "only unreadable images": r"class folder .*fox holds no readable images",
    "case": r"class folders '.*Cat' and '.*cat' differ only in case, Unicode form or surrounding spaces",
    "unicode form": r"class folders '.*fish' and '.*ﬁsh' differ only in case",
    "spaces": r"class folders '.*dog' and '.*dog ' differ only",
    "val class not in train": r"val/cow is not a class of the training images \(they have 'cat', 'dog'\)",
}


@pytest.mark.parametrize("case", list(BAD_FOLDERS))
def test_a_bad_folder_is_one_line_and_nothing_is_written(tmp_path, case):
    root = _bad_folder(tmp_path, case)
    with pytest.raises(HydraEdgeError, match=BAD_FOLDERS[case]):
        load_data(str(root), preset("digits", num_classes=3 if (root / "fox").is_dir() else 2))
    result = CliRunner().invoke(main, ["train", "--data", str(root), "--preset", "digits", "--epochs", "1",
                                       "--out", str(tmp_path / "run")])
    assert result.exit_code == 1, result.output
    lines = [line for line in result.output.strip().splitlines() if not line.startswith("warning: skipped")]
    assert len(lines) == 1 and lines[0].startswith("Error: ") and not (tmp_path / "run").exists(), result.output


@pytest.mark.parametrize("fraction", [0, 1, 1.5, -0.2, float("nan"), float("inf"), True, "0.2"])
def test_the_held_out_fraction_is_a_number_strictly_between_0_and_1(fraction):
    with pytest.raises(HydraEdgeError, match=r"held-out fraction .* is not a number between 0 and 1"):
        DataSpec("digits", val_fraction=fraction)
    assert DataSpec("digits", val_fraction=0.05).val_fraction == 0.05
