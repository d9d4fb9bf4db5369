"""`hydra-edge info` prints the paper's table; analytic counts equal the real modules."""

from __future__ import annotations

import torch
from click.testing import CliRunner

from hydra_edge import HydraViT
from hydra_edge.cli import main
from hydra_edge.model.config import preset
from hydra_edge.model.sizes import subnet_size

# docs/hydravit.md: heads -> (params M, GMACs, fp32 MiB, int8 MiB)
PAPER = {
    3: (5.72, 1.254, 21.8, 5.5), 4: (9.98, 2.136, 38.1, 9.5), 5: (15.43, 3.251, 58.8, 14.7),
    6: (22.05, 4.599, 84.1, 21.0), 7: (29.85, 6.179, 113.9, 28.5), 8: (38.84, 7.991, 148.2, 37.0),
    9: (49.00, 10.036, 186.9, 46.7), 10: (60.34, 12.313, 230.2, 57.5), 11: (72.87, 14.822, 278.0, 69.5),
    12: (86.57, 17.564, 330.2, 82.6),
}


def test_b16_sizes_match_the_paper_table():
    cfg = preset("b16")
    for k, (params, gmacs, fp32, int8) in PAPER.items():
        s = subnet_size(cfg, k)
        assert abs(s.params / 1e6 - params) < 0.01 and abs(s.gmacs - gmacs) < 0.01, k
        assert abs(s.fp32_mib - fp32) < 0.1 and abs(s.int8_mib - int8) < 0.1, k


def test_analytic_params_equal_module_params():
    with torch.device("meta"):
        for name in ("b16", "digits"):
            model = HydraViT.from_preset(name)
            for k in model.config.heads:
                assert subnet_size(model.config, k).params == sum(p.numel() for p in model.subnetwork(k).parameters())


def test_info_prints_the_b16_table():
    result = CliRunner().invoke(main, ["info", "--preset", "b16"])
    assert result.exit_code == 0, result.output
    for k, (params, gmacs, fp32, int8) in PAPER.items():
        line = next(l for l in result.output.splitlines() if l.strip("│ ").startswith(f"{k} "))
        assert f"{params:.2f}" in line and f"{gmacs:.3f}" in line and f"{fp32:.1f}" in line, line


def test_info_rejects_an_unknown_preset():
    result = CliRunner().invoke(main, ["info", "--preset", "b99"])
    assert result.exit_code == 1
    assert result.output.strip().splitlines() == ["Error: unknown preset 'b99'; choose one of ['b16', 'digits', 'mini']"]


def test_analytic_macs_equal_what_the_model_and_its_exported_form_compute():
    """torch's own FLOP counter (2 per multiply-accumulate, matmuls and convolutions) on the eager
    subnetwork and on the form every exporter writes (its last block for the class token alone)."""
    from torch.utils.flop_counter import FlopCounterMode

    from hydra_edge.convert.rewrites import class_token_only, rewritten

    model = HydraViT.from_preset("digits")
    x = torch.zeros(1, model.config.in_chans, model.config.img_size, model.config.img_size)
    for k in (3, 12):
        sub = model.subnetwork(k).eval()
        for module, expected in ((sub, subnet_size(model.config, k).macs),
                                 (rewritten(sub, class_token_only), subnet_size(model.config, k).exported_macs)):
            with FlopCounterMode(display=False) as counter, torch.no_grad():
                module(x)
            assert counter.get_total_flops() == 2 * expected, (k, type(module.blocks[-1]).__name__)
        assert subnet_size(model.config, k).exported_macs < subnet_size(model.config, k).macs
