"""Export-time forms of a dense subnetwork: the same parameters and the same logits, less work for a runtime.

Each change swaps some modules' classes in a copy that ``rewritten`` makes; no parameter is renamed or
reshaped, so nested weight ranges and compaction see the weights they expect.
The eager model (``vit.py``) stays the reference every artefact is verified against.
"""

from __future__ import annotations

import copy
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from ..model.vit import Attention, Block, PatchEmbed, VisionTransformer


class BmmAttention(Attention):
    """Attention as two 3-D ``bmm`` over (batch x heads), K transposed inside the first.

    ``q @ k.transpose(-2, -1)`` on 4-D tensors exports as ``matmul``, which lowers to expands and views
    around a ``bmm``: a converter folds K's transpose only when it is the ``bmm``'s own operand, and a
    quantizer can put int8 quantize/dequantize pairs straight around the ``bmm`` only when nothing lies
    between them (``pt2e.attention_matmul_quantizer``). ``queries``: only the first that many tokens ask
    (``class_token_only``); keys and values still come from every token.
    """

    queries: int | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, N, D = x.shape
        h, d = self.num_heads, self.head_dim
        qkv = self.qkv(x).reshape(B, N, 3, h, d).permute(2, 0, 3, 1, 4).reshape(3, B * h, N, d)
        q, k, v = qkv.unbind(0)  # (B * heads, N, head_dim)
        if self.queries is not None:
            q, N = q[:, :self.queries], self.queries
        attn = torch.bmm(q * d**-0.5, k.transpose(1, 2)).softmax(dim=-1)
        return self.proj(torch.bmm(attn, v).reshape(B, h, N, d).transpose(1, 2).reshape(B, N, h * d))


class HeadsApartAttention(BmmAttention):
    """``BmmAttention`` with Q, K and V each cut from the QKV output and laid out for its own matmul.

    For LiteRT. XNNPACK packs a batch matmul's right operand on every inference, and packs it much
    faster from (output, reduction) rows (a TFLite ``adj_y`` operand) than from (reduction, output)
    ones: V, the right operand of softmax x V, is therefore handed over as V^T (one 2-D transpose of
    its (tokens, width) slice), K as it is (transposed inside the matmul), Q transposed for the heads.
    The converter cancels a transpose into a matmul's ``adj_y`` back against the one before it; a
    reshape between them (V^T from (B, width, tokens) to (B x heads, head_dim, tokens)) keeps both.
    Three slices and three transposes replace one transpose, five reshapes and three slices, which
    XNNPACK ran as copies (docs/benchmarks.md, "Export-time forms").
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, N, D = x.shape
        h, d = self.num_heads, self.head_dim
        q, k, v = self.qkv(x).split(h * d, dim=-1)  # (B, N, width) each
        if self.queries is not None:
            q = q[:, :self.queries]
        n = q.shape[1]
        q = q.reshape(B, n, h, d).transpose(1, 2).reshape(B * h, n, d)
        k = k.reshape(B, N, h, d).transpose(1, 2).reshape(B * h, N, d)
        v_t = v.transpose(1, 2).reshape(B * h, d, N)
        attn = torch.bmm(q * d**-0.5, k.transpose(1, 2)).softmax(dim=-1)
        out = torch.bmm(attn, v_t.transpose(1, 2))  # (B * heads, n, head_dim)
        return self.proj(out.reshape(B, h, n, d).transpose(1, 2).reshape(B, n, h * d))


class ClassTokenBlock(Block):
    """A block whose output is the class token's alone (its attention asks with that token only)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x[:, :1] + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class ClassTokenViT(VisionTransformer):
    """A ViT whose last block hands on the class token alone: the classifier reads it as (B, D) with a
    reshape rather than a select, which ExecuTorch ran outside XNNPACK between two delegate calls."""

    def forward_head(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(x.flatten(1))  # (B, 1, D) -> (B, classes)


class PatchLinearEmbed(PatchEmbed):
    """The stride-p patch convolution as one fully-connected layer over the flattened patches.

    The kernel is read as (D, C * p * p), the convolution's own bytes. XNNPACK runs ExecuTorch's patch
    convolution (3 input channels, 16x16 taps, NCHW input transposed first) far below its
    fully-connected rate, and the same work as a matmul at that rate (docs/benchmarks.md).
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, C, H, W = x.shape
        p = self.proj.kernel_size[0]
        patches = x.reshape(B, C, H // p, p, W // p, p).permute(0, 2, 4, 1, 3, 5).reshape(B, -1, C * p * p)
        return F.linear(patches, self.proj.weight.reshape(self.proj.weight.shape[0], -1), self.proj.bias)


class PatchRowsEmbed(PatchEmbed):
    """The patch convolution over the patches laid out as p channels (one row of a patch) by C x p pixels.

    For LiteRT, whose converter writes NHWC: the 3-channel image made XNNPACK's int8 IGEMM read 3
    contiguous values per kernel tap, a fraction of its fully-connected rate; with a (C, p) kernel
    and stride it runs near that rate. LiteRT stores the kernel as (D, C, p, p): the parameter's own
    layout and rows.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, C, H, W = x.shape
        p = self.proj.kernel_size[0]
        patches = x.reshape(B, C, H // p, p, W // p, p).permute(0, 2, 4, 1, 3, 5)  # (B, h, w, C, p, p)
        # NHWC (B, (patch, c), i, j) seen as NCHW: the converter's own NCHW -> NHWC transposes cancel these
        rows = patches.reshape(B, -1, p, p).permute(0, 3, 1, 2)
        out = F.conv2d(rows, self.proj.weight.permute(0, 3, 1, 2), self.proj.bias, stride=(C, p))
        return out.permute(0, 2, 3, 1).reshape(B, -1, out.shape[1])  # (B, patches, D)


class CentredLayerNorm(nn.LayerNorm):
    """LayerNorm written out: centre, mean of squares, ``rsqrt``, scale and shift.

    For LiteRT. litert-torch lowers ``layer_norm`` to twelve ops (two means, a squared difference,
    ``rsqrt``, three reshapes and five element-wise ops); written out with ``keepdim`` means it is
    eight, and XNNPACK fuses the square into the second mean. Each operator costs LiteRT about half a
    microsecond beyond its work, and a ViT has two LayerNorms per block (docs/benchmarks.md).
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        centred = x - x.mean(dim=-1, keepdim=True)
        scaled = centred * torch.rsqrt((centred * centred).mean(dim=-1, keepdim=True) + self.eps)
        return scaled * self.weight + self.bias


def rewritten(model: torch.nn.Module, *changes: Callable[[torch.nn.Module], None]) -> torch.nn.Module:
    """A copy of ``model`` with each change applied to it in turn: one copy, however many changes
    (a 12-head b16 is 350 MB in float32, and a conversion worker's memory is budgeted)."""
    model = copy.deepcopy(model)
    for change in changes:
        change(model)
    return model


def _reclass(model: torch.nn.Module, old: type, new: type) -> None:
    for m in model.modules():  # the class changes, the module and its parameters stay
        if type(m) is old:
            m.__class__ = new


def class_token_only(model: torch.nn.Module) -> None:
    """Make the last block compute the class token's output alone, the only token the logits read.

    After the last attention's softmax everything works on each token by itself (projection, residual,
    MLP, the final norm), and that attention needs every token's keys and values but only the class
    token's query. The other tokens' part of the last block, a sixteenth of a b16 subnetwork's
    multiply-accumulates (``sizes.SubnetSize.exported_macs``), is never computed. Exact up to float
    rounding: each remaining op sees the same values. A module that is not a ViT (a single layer a
    benchmark exports) is left as it is.
    """
    last = model.blocks[-1] if type(model) is VisionTransformer else None
    if type(last) is Block and type(last.attn) is Attention:
        model.__class__, last.__class__, last.attn.__class__ = ClassTokenViT, ClassTokenBlock, BmmAttention
        last.attn.queries = 1


def bmm_attention(model: torch.nn.Module) -> None:
    """Make every attention run as two 3-D ``bmm`` (``BmmAttention``)."""
    _reclass(model, Attention, BmmAttention)


def heads_apart(model: torch.nn.Module) -> None:
    """Make every ``BmmAttention`` lay out Q, K and V for its own matmul (``HeadsApartAttention``);
    after ``bmm_attention`` and ``class_token_only``, whose query count it keeps."""
    _reclass(model, BmmAttention, HeadsApartAttention)


def centred_layer_norm(model: torch.nn.Module) -> None:
    """Make every LayerNorm the written-out form (``CentredLayerNorm``)."""
    _reclass(model, nn.LayerNorm, CentredLayerNorm)


def patch_linear(model: torch.nn.Module) -> None:
    """Make the patch embedding one fully-connected layer (``PatchLinearEmbed``)."""
    _reclass(model, PatchEmbed, PatchLinearEmbed)


def patch_rows(model: torch.nn.Module) -> None:
    """Make the patch embedding a convolution over patch rows (``PatchRowsEmbed``)."""
    _reclass(model, PatchEmbed, PatchRowsEmbed)
