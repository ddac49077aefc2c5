"""The forecast and warnings as the framework callbacks log them: scalar tags and one line per new
warning, read from a real watch over a training loop."""

from __future__ import annotations

import torch
from torch import nn

import nan_hunter
from nan_hunter.integrations.early_warning import WarningLog, scalars


class Doubling(nn.Module):
    """Two blocks whose output doubles every step (a scale parameter the loop doubles): a steady
    +6 dB per step the forecast projects."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(4, 4), nn.Linear(4, 4)])
        self.scale = nn.Parameter(torch.ones(()))

    def forward(self, x):
        for layer in self.layers:
            x = layer(x) * self.scale
        return x


def test_scalars_and_warning_lines_from_a_watch():
    torch.manual_seed(0)
    model = Doubling()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, eps=1.0)  # eps above every gradient: update collapse
    x = torch.randn(3, 4)
    log = WarningLog()
    assert scalars(None) == {} and log.new_lines(None) == []
    with nan_hunter.watch(model, optimizer=opt, sample_every=1) as w:
        for _ in range(8):
            model(x).square().mean().backward()
            opt.step()
            opt.zero_grad()
            with torch.no_grad():
                model.scale.mul_(2.0)
        got = scalars(w)
        lines = log.new_lines(w)
    assert got["nanhunter/warnings"] == float(len(w.precursors())) >= 1
    tags = [k for k in got if k.startswith("nanhunter/headroom_db/")]
    assert tags and all(k.count("/") == 4 for k in tags)  # nanhunter/headroom_db/<module>/<signal>/<dtype>
    assert any(k.startswith("nanhunter/projected_step/") for k in got)
    assert any("warning update_collapse" in line and "fix:" in line for line in lines)
    assert log.new_lines(w) == []  # each warning said once
