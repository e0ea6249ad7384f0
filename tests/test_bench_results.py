"""The README's benchmark numbers are generated: its block is bench/results.json rendered, never typed by hand."""

import json
import re

from bench import publish
from bench.publish import SECTIONS
from tests.conftest import ROOT


def test_readme_block_is_the_committed_results_rendered():
    text = (ROOT / "README.md").read_text()
    results = publish.load()
    assert publish.readme_block(text) == publish.block(results), (
        "README.md's benchmark block differs from bench/results.json: run `.venv/bin/python -m bench.publish` "
        "(or `./course bench --sections ... --publish`), never edit the block")


def test_committed_results_are_well_formed():
    results = json.loads(publish.RESULTS.read_text())
    for name, entry in results["sections"].items():
        assert name in SECTIONS, f"bench/results.json holds an unknown section {name!r}"
        assert entry["title"] == SECTIONS[name]
        assert entry["markdown"].strip() and entry["machine"] and entry["mode"]
        assert "failed:" not in entry["markdown"][:10], f"a failed section was published: {name}"


def test_no_benchmark_number_is_typed_outside_the_block():
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Benchmarks"):]
    section = section[: section.index("\n## ", 1)] if "\n## " in section[1:] else section
    outside = section.replace(publish.readme_block(text), "")
    measured = re.findall(r"\d+(?:\.\d+)?\s?(?:×|ms|µs|min\b|s\b)", outside)
    allowed = {"60 s", "40 min"}  # a busy timeout and how long a full run takes: settings, not measurements
    assert set(measured) <= allowed, f"numbers typed by hand in README's Benchmarks section: {measured}"


def test_render_round_trip(tmp_path):
    record = publish.run_record("a machine", "quick", {"kv-cache": (SECTIONS["kv-cache"], "| a |\n|---|", 1.0)})
    results = {"sections": record["sections"]}
    rendered = publish.block(results)
    assert rendered.startswith(publish.BEGIN) and rendered.endswith(publish.END)
    assert "| a |" in rendered and "`notebooks`" in rendered  # the missing sections are named
    readme = f"intro\n\n{publish.block({'sections': {}})}\n\nafter\n"
    assert publish.readme_block(readme.replace(publish.block({"sections": {}}), rendered)) == rendered
