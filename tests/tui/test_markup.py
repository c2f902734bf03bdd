"""Bundle strings are text, never markup, on every screen (issue 29).

The overview rendered a group description `[reverse]MARKUP-mesh_dp[/reverse]` and a tool
line `[blink]BLINK[/blink]` as markup, while the collectives screen showed the same strings
literally. Every screen now shows them as the collectives screen did; a `[/]` that closes
nothing, which as markup raised MarkupError in the palette's worker, is text too.
(tests/test_hostile_strings.py sweeps every field with escapes as well.)
"""

from __future__ import annotations

import dataclasses

import pytest
from tui_helpers import make_app, screen_text, settle, sync

from prism_rr.format import GroupInfo, pack
from prism_rr.format.synthetic import synthetic_records

DESC = "[reverse]MARKUP-{}[/reverse][/]"
TOOL = "[blink]BLINK[/blink] [@click=app.quit]QUIT[/]"


@pytest.fixture(scope="module")
def marked(tmp_path_factory):
    """The small run, its groups described (and named, and their backend) in markup."""
    from conftest import _write_spools

    def edit(rank, recs):
        return [dataclasses.replace(r, text=DESC.format(r.text), name=f"[bold]{r.name}[/bold]",
                                    backend="[i]gloo[/i]") if type(r) is GroupInfo else r for r in recs]

    d = tmp_path_factory.mktemp("markup")
    out = d / "marked.prism"
    pack(_write_spools(d / "marked.d", 8, 150, edit), out, manifest_extra={"created_unix_ns": 0, "tool": TOOL})
    return out


def _styled(app, word: str, attribute: str) -> bool:
    return any(word in seg.text and seg.style is not None and getattr(seg.style, attribute)
               for strip in app.screen._compositor.render_strips() for seg in strip)


@sync
async def test_overview_shows_the_tool_and_group_descriptions_as_text(marked):
    app = make_app(marked)
    async with app.run_test(size=(160, 40)) as pilot:
        await settle(pilot)
        text = screen_text(app)
        assert "[reverse]MARKUP-mesh_dp[/reverse][/]" in text and "[blink]BLINK[/blink]" in text, text
        assert not _styled(app, "MARKUP", "reverse") and not _styled(app, "BLINK", "blink")
        # the words [@click=app.quit] are a place to click, and nothing happens
        lines = text.splitlines()
        row = next(i for i, line in enumerate(lines) if "QUIT" in line)
        await pilot.click(offset=(lines[row].index("QUIT") + 1, row))
        await pilot.pause()
        assert app.is_running and app.return_code is None


@sync
async def test_collectives_details_and_palette_show_them_alike(marked):
    from textual.command import CommandList

    app = make_app(marked)
    async with app.run_test(size=(160, 40)) as pilot:
        await settle(pilot)
        await app.show_group(max(app.model.groups))
        await settle(pilot)
        text = screen_text(app)
        assert "[reverse]MARKUP-mesh_dp[/reverse][/]" in text and "[i]gloo[/i]" in text, text
        assert not _styled(app, "MARKUP", "reverse")
        await pilot.press("2")
        await settle(pilot, app.screen.timeline)
        dp = next(g["id"] for g in app.model.groups.values() if 0 in g["ranks"] and "mesh_dp" in g["desc"])
        app.screen.goto(0, dp, 0)
        await settle(pilot, app.screen.timeline)
        assert "[reverse]MARKUP-mesh_dp" in screen_text(app) and not _styled(app, "MARKUP", "reverse")
        await pilot.press("ctrl+p")
        await pilot.pause(0.5)
        palette = app.screen.query_one(CommandList)
        prompts = [str(palette.get_option_at_index(i).prompt) for i in range(palette.option_count)]
        assert any("[reverse]MARKUP-mesh_dp[/reverse][/]" in p for p in prompts), prompts
        assert not _styled(app, "MARKUP", "reverse")
        await pilot.press(*"mesh")
        await pilot.pause(1.0)
        assert "MARKUP-mesh" in screen_text(app) and not _styled(app, "MARKUP", "reverse")
        await pilot.press("escape")
        svg = app.export_screenshot()
        assert "[reverse]MARKUP" in svg.replace("&#160;", " ")
