"""Tiled statistics (``tile > 0``) equal the whole logit matrix (``tile = 0``): every loss and form.

In float64 at G = 512 with tiles of 100 columns (the last one partial): the loss and the gradients of
the features, the logit scale and the bias within 1e-10 of their size, and the DeCL state after each
step. At a small G the tiled losses also equal the slow references of ``loss_reference``. The gloo
ranks' check is in test_losses_distributed_tiled.py.
"""

from __future__ import annotations

import pytest
import torch
from loss_reference import curl, dcl_general, dcl_top, features, infonce
from open_clip.loss import ClipLoss

from clip_dcl.losses import InfoNCEFromStats, create_loss
from clip_dcl.losses.coca import CoCaObjective
from clip_dcl.losses.tiled import DEFAULT_TILE, parse_tile, resolve_tile

G = 512
TILE = 100
REL = 1e-10

#: (id, loss, kwargs, M captions per image, with a logit bias)
FORMS = [
    ("clip", "clip", {}, 1, False),
    ("clip_bias", "clip", {}, 1, True),
    ("clip_m3", "clip", {}, 3, False),
    ("dcl", "dcl", {"tau_plus": 0.1}, 1, False),
    ("dcl_bias", "dcl", {"tau_plus": 0.1}, 1, True),
    ("dcl_biased", "dcl", {"tau_plus": 0.4, "clamp": "biased"}, 1, False),
    ("dcl_auto", "dcl", {"tau_plus": "auto", "tau_momentum": 0.5}, 1, False),
    ("dcl_m3", "dcl", {"tau_plus": 0.1}, 3, False),
    ("dcl_temperature", "dcl", {"tau_plus": 0.1, "temperature": 0.1}, 1, False),
    ("hcl", "dcl", {"tau_plus": 0.1, "beta": 1.0}, 1, False),
    ("hcl_m2_biased_bias", "dcl", {"tau_plus": 0.3, "beta": 0.5, "clamp": "biased"}, 2, True),
    ("dcl_top", "dcl", {"tau_plus": 0.15, "same_class": "top"}, 1, False),
    ("dcl_top_bias", "dcl", {"tau_plus": 0.15, "same_class": "top"}, 1, True),
    ("dcl_top_hcl_m2_biased", "dcl", {"tau_plus": 0.3, "same_class": "top", "beta": 0.5, "clamp": "biased"}, 2, False),
    ("dcl_top_auto", "dcl", {"tau_plus": "auto", "same_class": "top", "tau_momentum": 0.5}, 1, False),
    ("decl_index", "decl", {"rate": "index", "num_samples": 2 * G, "gamma": 0.5, "sample_u": True}, 1, False),
    ("decl_index_read_first", "decl", {"rate": "index", "num_samples": 2 * G, "include_current": False}, 1, False),
    ("decl_index_m3", "decl", {"rate": "index", "num_samples": 2 * G, "sample_u": True}, 3, False),
    ("decl_queue", "decl", {"rate": "queue", "queue_size": 300, "schedule": "harmonic", "lam": 2.0}, 1, False),
    ("decl_batch", "decl", {"rate": "batch", "schedule": "constant", "lam": 0.7, "sample_u": True}, 1, False),
    (
        "decl_absolute_fixed",
        "decl",
        {
            "rate": "index",
            "num_samples": 2 * G,
            "estimate": "absolute",
            "schedule": "decl",
            "temperature_mode": "fixed",
            "temperature": 0.05,
        },
        1,
        False,
    ),
    ("decl_learned", "decl", {"rate": "index", "num_samples": 2 * G, "temperature_mode": "learned"}, 1, True),
    (
        "decl_rgclg",
        "decl",
        {"rate": "index", "num_samples": 2 * G, "temperature_mode": "rgclg", "schedule": "harmonic", "lam": 2.0},
        1,
        False,
    ),
    (
        "decl_cosine_gamma",
        "decl",
        {"rate": "index", "num_samples": 2 * G, "gamma_schedule": "cosine", "gamma_decay_steps": 2},
        1,
        False,
    ),
    ("curl_m3", "curl", {}, 3, False),
    ("curl_hinge_m2", "curl", {"link": "hinge"}, 2, False),
]


def assert_near(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    """``max |got - want| <= REL * max |want|``: relative to the tensor's size (entries near 0 have no digits;
    a gradient that is 0 analytically, InfoNCE's to the bias, is rounding noise of 1e-17)."""
    scale = float(want.abs().max())
    err = float((got - want).abs().max())
    assert err <= REL * max(scale, 1e-4), f"{what}: {err:.3g} against a size of {scale:.3g}"


def steps(loss_fn, m: int, bias: bool, scale: float, count: int):
    """``count`` training calls on fresh float64 features; each call's loss, gradients and buffers."""
    out = []
    for step in range(count):
        f, g = features(G, m=m, d=16, seed=10 + step, align=0.5)
        f.requires_grad_()
        g.requires_grad_()
        s = torch.tensor(scale, dtype=torch.float64, requires_grad=True)
        b = torch.tensor(-3.0, dtype=torch.float64, requires_grad=True) if bias else None
        ids = torch.randperm(2 * G, generator=torch.Generator().manual_seed(step))[:G]
        loss = loss_fn(f, g, s, b, sample_ids=ids)
        inputs = [f, g, s] + ([b] if bias else [])
        grads = torch.autograd.grad(loss, inputs, allow_unused=True)  # a fixed temperature leaves s unused
        grads = [torch.zeros_like(x) if d is None else d for x, d in zip(inputs, grads)]
        buffers = {k: v.detach().clone() for k, v in loss_fn.named_buffers()}
        out.append((loss.detach(), grads, buffers))
    return out


@pytest.mark.parametrize("name, loss, kwargs, m, bias", FORMS, ids=[f[0] for f in FORMS])
def test_tiled_equals_the_whole_matrix(name, loss, kwargs, m, bias):
    # OpenCLIP's clamp (100) on every other form, a trained model's scale on the rest; two steps where
    # the loss keeps state across them (DeCL's rates and schedules)
    scale = 100.0 if [f[0] for f in FORMS].index(name) % 2 else 20.0
    count = 2 if loss == "decl" else 1
    whole = create_loss(loss, tile=0, **kwargs)
    tiled = create_loss(loss, tile=TILE, **kwargs)
    if loss == "clip" and m == 1:
        assert isinstance(whole, ClipLoss) and isinstance(tiled, InfoNCEFromStats)
    if loss == "clip" and bias:  # ClipLoss has no bias: both from the statistics, whole against tiled
        whole = create_loss("clip", tile=0, no_grad_gather=True)
    for step, (want, got) in enumerate(zip(steps(whole, m, bias, scale, count), steps(tiled, m, bias, scale, count))):
        assert_near(got[0], want[0], f"loss, step {step}")
        for i, (a, b) in enumerate(zip(got[1], want[1])):
            assert_near(a, b, f"gradient {i}, step {step}")
        assert got[2].keys() == want[2].keys()
        for key, buf in want[2].items():
            if buf.is_floating_point() and buf.numel():
                finite = torch.isfinite(buf)
                assert torch.equal(finite, torch.isfinite(got[2][key])), key
                assert_near(got[2][key][finite], buf[finite], f"buffer {key}, step {step}")
            else:
                assert torch.equal(got[2][key], buf), key
    if hasattr(tiled, "metrics") and "clamp_rate" in tiled.metrics:
        assert float(tiled.metrics["clamp_rate"]) == float(whole.metrics["clamp_rate"])


def _reference_inputs(m):
    f, g = features(9, m=m, d=6, seed=3, align=0.7)
    s = torch.tensor(12.0, dtype=torch.float64, requires_grad=True)
    return f.requires_grad_(), g.requires_grad_(), s


@pytest.mark.parametrize(
    "loss, kwargs, m, reference",
    [
        ("clip", {}, 2, lambda f, g, s: infonce(f, g, s) if f.shape == g.shape else None),
        ("dcl", {"tau_plus": 0.2, "beta": 0.7}, 2, lambda f, g, s: dcl_general(f, g, s, 0.2, beta=0.7)[0]),
        ("dcl", {"tau_plus": 0.3, "clamp": "biased"}, 1, lambda f, g, s: dcl_general(f, g, s, 0.3, "biased")[0]),
        (
            "dcl",
            {"tau_plus": 0.25, "same_class": "top", "beta": 0.5},
            3,
            lambda f, g, s: dcl_top(f, g, s, 0.25, beta=0.5)[0],
        ),
        ("curl", {}, 3, lambda f, g, s: curl(f, g, s)),
    ],
    ids=["clip", "hcl_m2", "dcl_biased", "dcl_top_hcl_m3", "curl_m3"],
)
def test_tiled_equals_the_slow_reference(loss, kwargs, m, reference):
    """Tiles of 4 columns over 9 images (and their M captions), against the loops of ``loss_reference``."""
    f, g, s = _reference_inputs(m)
    want = reference(f, g, s)
    if want is None:  # M > 1 InfoNCE: dcl at tau_plus 0 is InfoNCE exactly
        want = dcl_general(f, g, s, 0.0)[0]
    got = create_loss(loss, tile=4, **kwargs)(f, g, s)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=0)
    for a, b in zip(torch.autograd.grad(got, [f, g, s]), torch.autograd.grad(want, [f, g, s])):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_the_tiled_loss_keeps_no_matrix_for_backward():
    """What autograd saves between forward and backward grows with the batch, not with its square."""
    saved = {}
    for n in (64, 256):
        f, g = features(n, d=8, dtype=torch.float32)
        f.requires_grad_()
        g.requires_grad_()
        total = []

        def pack(t):
            total.append(t.untyped_storage().nbytes())
            return t

        loss_fn = create_loss("dcl", tau_plus=0.1, beta=1.0, same_class="top", tile=32)
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            loss_fn(f, g, torch.tensor(10.0))
        saved[n] = sum(total)
    assert saved[256] < 6 * saved[64]  # linear: 4x; the whole matrix would be 16x


def test_bf16_autocast_gives_the_whole_matrix_result():
    """Under autocast the statistics are float32, tiled or not: equal to float32 rounding."""
    f, g = features(96, d=16, dtype=torch.float32, align=0.5)
    s = torch.tensor(100.0)
    out = []
    for tile in (0, 40):
        fb, gb = f.clone().requires_grad_(), g.clone().requires_grad_()
        loss_fn = create_loss("dcl", tau_plus=0.1, beta=1.0, tile=tile)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = loss_fn(fb.to(torch.bfloat16), gb.to(torch.bfloat16), s)
        loss.backward()
        assert torch.isfinite(loss) and torch.isfinite(fb.grad).all() and torch.isfinite(gb.grad).all()
        out.append((loss.detach(), fb.grad, gb.grad))
    torch.testing.assert_close(out[0][0], out[1][0], rtol=1e-5, atol=1e-5 * float(out[1][0].abs()))
    # the gradients reach the float32 leaves through the bfloat16 cast: the two paths' float32 gradients differ by
    # float32 rounding, which may fall on either side of a bfloat16 midpoint, so they agree to one bfloat16 step
    for a, b in zip(out[0][1:], out[1][1:]):
        torch.testing.assert_close(a, b, rtol=2**-7, atol=1e-5 * float(b.abs().max()))


def test_coca_takes_the_tiled_term():
    f, g = features(32, d=8)
    logits = torch.randn(32, 5, 11, dtype=torch.float64)
    labels = torch.randint(0, 11, (32, 5))
    s = torch.tensor(10.0, dtype=torch.float64)
    values = [
        CoCaObjective(create_loss("dcl", tau_plus=0.1, tile=tile), 2.0, 1.0)(f, g, logits, labels, s, output_dict=True)
        for tile in (0, 7)
    ]
    assert values[0].keys() == values[1].keys() == {"dcl_loss", "caption_loss"}
    for key in values[0]:
        torch.testing.assert_close(values[1][key], values[0][key], rtol=1e-12, atol=0)


def test_the_default_tile_is_the_devices():
    assert create_loss("dcl").tile is None
    g, width = DEFAULT_TILE["cpu"]  # the CPU tiles from the G where it was measured faster, square matrices only
    assert resolve_tile(None, torch.device("cpu"), g) == width > 0
    assert resolve_tile(None, torch.device("cpu"), g - 1) == 0
    assert resolve_tile(None, torch.device("cpu"), g, square=False) == 0
    assert resolve_tile(None, torch.device("meta"), 10 * g) == DEFAULT_TILE.get("meta", (0, 0))[1] == 0
    assert resolve_tile(7, torch.device("cpu")) == 7
    assert resolve_tile(0, torch.device("cpu"), 10 * g) == 0
    # a loss counts the gathered columns: B x world_size
    assert create_loss("dcl").tile_for(torch.zeros(g, 2)) == width
    assert create_loss("dcl", world_size=2, rank=0).tile_for(torch.zeros(g // 2, 2)) == width
    assert create_loss("dcl", world_size=2, rank=0, local_loss=True).tile_for(torch.zeros(g // 2, 2)) == 0
    assert create_loss("dcl").tile_for(torch.zeros(g // 2, 2)) == 0
    assert isinstance(create_loss("clip"), ClipLoss)  # the baseline stays OpenCLIP's own unless a tile is asked


@pytest.mark.parametrize("bad", [-1, 2.5, True, "8"])
def test_a_bad_tile_is_refused_naming_it(bad):
    for loss in ("clip", "dcl", "decl", "curl"):
        extra = {"num_samples": 4} if loss == "decl" else {}
        with pytest.raises(ValueError, match=f"tile={bad!r} must be an integer >= 0"):
            create_loss(loss, tile=bad, **extra)


def test_the_flag_parses_a_width():
    assert parse_tile("512") == 512 and parse_tile("0") == 0
    with pytest.raises(ValueError, match="tile='x' is not an integer"):
        parse_tile("x")
    with pytest.raises(ValueError, match="tile=-3 must be an integer >= 0"):
        parse_tile("-3")


@pytest.mark.parametrize("kwargs", [{"same_class": "top", "tau_plus": 0.6}, {"tau_plus": 0.1, "beta": 3.0}])
def test_float32_at_the_largest_scale_equals_the_whole_matrix(kwargs):
    """At s = 100 a row spans 200 in logits: each statistic is shifted by its own maximum (the tail's lies
    below the top k), so none underflows in float32."""
    f, g = features(96, m=2, d=16, dtype=torch.float32, align=2.0)
    s = torch.tensor(100.0)
    out = []
    for tile in (0, 40):
        fb, gb = f.clone().requires_grad_(), g.clone().requires_grad_()
        loss_fn = create_loss("dcl", tile=tile, **kwargs)
        loss = loss_fn(fb, gb, s)
        loss.backward()
        out.append((loss.detach(), fb.grad, gb.grad, loss_fn.metrics["clamp_rate"]))
    assert float(out[1][3]) == float(out[0][3])
    for a, b in zip(out[1][:3], out[0][:3]):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5 * float(b.abs().max()))


def test_the_trainer_builds_the_tiled_loss_from_loss_tile(tmp_path):
    from conftest import TINY, train_in_process

    from clip_dcl.train.flags import parse_train_args

    config = parse_train_args(
        ["--loss", "decl", "--loss-tile", "8", "--dataset-type", "synthetic", "--train-num-samples", "16"]
    )
    assert config.loss_kwargs["tile"] == 8
    config = parse_train_args(["--loss", "clip", "--loss-tile", "8", "--dataset-type", "synthetic"])
    assert config.loss_kwargs["tile"] == 8
    synthetic = ["--dataset-type", "synthetic", "--train-num-samples", "16", "--batch-size", "8"]
    res = train_in_process(["--loss", "clip", "--loss-tile", "4", *synthetic, *TINY, "--logs", tmp_path, "--name", "x"])
    assert res.returncode == 0, res.stderr
    assert "-> InfoNCEFromStats(" in (log := (tmp_path / "x" / "out.log").read_text()) and "tile=4)" in log
