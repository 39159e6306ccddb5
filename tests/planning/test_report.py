"""The plan as a page (autopar.planning.report) and planning a Hugging Face configuration
from the command line (autopar.hf_config, ``autopar plan --hf``).

The page is checked as text here (self-contained, every region, the measured step) and,
in the extended suite, opened in headless Chromium (Debian's package; ``make browser``
installs it where apt-get can): no console errors, a row and a box per region, a click
on a box showing its row. Without Chromium or selenium that test skips, saying which.
"""
from __future__ import annotations

import html.parser
import json
import os
import re
import shutil
import subprocess
import sys

import pytest
import torch

import autopar
from autopar.cli import main as cli_main

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIGS = os.path.join(ROOT, "examples", "configs")


class _Collect(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.tags, self.sources = [], []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        for key, value in attrs:
            if key in ("src", "href") and value:
                self.sources.append(value)


def _small_pipeline_plan():
    model = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.GELU()) for _ in range(4)])
    return autopar.plan(model, 4, (torch.randn(16, 32),), None, {"pipeline": 2, "data": 2, "microbatches": 4},
                        hardware="h100")


def test_the_report_is_one_self_contained_page_with_every_region(tmp_path):
    plan = _small_pipeline_plan()
    plan.save(str(tmp_path), measured_step_s=plan.step_s * 1.25)
    page = (tmp_path / "report.html").read_text()
    parser = _Collect()
    parser.feed(page)
    assert not parser.sources, f"the page loads {parser.sources}: it must need nothing beside itself"
    assert {"svg", "table", "script", "style"} <= set(parser.tags)
    for choice in plan.regions:
        assert f'data-region="{choice.region}"' in page.replace("&quot;", '"'), choice.region
    assert page.count('<tr data-region=') == len(plan.regions)
    assert "1.25× predicted" in page
    assert "pipeline rank 1" in page and "Pipeline timeline" in page  # per-rank memory bars, the timeline
    assert "device memory 80.00 GiB (red line)" in page and 'class="limit"' in page  # the h100's memory
    assert "chosen" in page


def test_plan_config_builds_the_configuration_on_meta_and_plans_it(tmp_path):
    plan = autopar.plan_config("llama", 8, "8x256", hardware="h100", strategy={"data": 4, "tensor": 2}, overrides=dict(
        hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=512))
    assert plan.model == "LlamaForCausalLM" and plan.world_size == 8 and plan.global_batch == 8
    assert any(c.kind == "attention" for c in plan.regions)
    with pytest.raises(ValueError, match="SEQUENCESxTOKENS"):
        autopar.plan_config("llama", 8, "8by256")
    with pytest.raises(ValueError, match="neither a config.json path nor a model type"):
        autopar.plan_config("lama", 8, "8x256")
    with pytest.raises(ValueError, match="exceed the configuration's max_position_embeddings"):
        autopar.plan_config("llama", 8, "8x4096", overrides={"max_position_embeddings": 2048})


def test_the_command_plans_a_config_file_and_names_bad_arguments(tmp_path, capsys):
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"model_type": "mistral", "hidden_size": 128, "intermediate_size": 256,
                                  "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                                  "vocab_size": 256}))
    out = tmp_path / "plan"
    assert cli_main(["plan", "--hf", str(config), "--world", "4", "--batch", "8x64", "--preset", "h100",
                     "--out", str(out), "--ranks", "1"]) == 0
    assert (out / "report.html").is_file() and (out / "rank0.py").is_file()
    assert "MistralForCausalLM" in capsys.readouterr().out
    assert cli_main(["plan", "--hf-model-type", "mistral", "--world", "4", "--no-save"]) == 2
    assert "need --batch" in capsys.readouterr().err
    assert cli_main(["plan", "--world", "4", "--no-save"]) == 2
    assert "give one of FILE.py:FUNCTION, --hf CONFIG or --hf-model-type TYPE" in capsys.readouterr().err
    assert cli_main(["plan", "--hf", str(tmp_path / "missing.json"), "--world", "4", "--batch", "8x64"]) == 2
    assert "neither a config.json path nor a model type" in capsys.readouterr().err
    assert cli_main(["plan", "--hf-model-type", "mistral", "--set", "hidden_size", "--world", "4",
                     "--batch", "8x64"]) == 2
    assert "KEY=VALUE" in capsys.readouterr().err
    from autopar.hf_config import parse_overrides  # lists and objects keep their commas
    assert parse_overrides('num_hidden_layers=2,layer_types=["full_attention","sliding_attention"],'
                           'rope_scaling={"rope_type":"linear","factor":2.0},act=gelu') == {
        "num_hidden_layers": 2, "layer_types": ["full_attention", "sliding_attention"],
        "rope_scaling": {"rope_type": "linear", "factor": 2.0}, "act": "gelu"}


def _browser():
    """A headless Chromium driven by selenium, or the reason there is none."""
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        return None, "selenium is not installed (pip install selenium; it is in autopar's test extras)"
    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if binary is None or driver is None:
        return None, "no chromium and chromedriver on PATH (make browser installs Debian's)"
    options = webdriver.ChromeOptions()
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1400,2000"):
        options.add_argument(arg)
    options.binary_location = binary
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service(driver), options=options), ""


# the configurations written out under examples/configs, the devices and batch they are planned for
BROWSED = [("llama3-70b.json", 512, "1024x4096", "a100-selene"), ("mixtral-8x7b.json", 64, "256x4096", "h100")]


@pytest.mark.extended
@pytest.mark.parametrize("config,world,batch,preset", BROWSED)
def test_the_report_of_a_real_configuration_opens_in_a_browser(tmp_path, config, world, batch, preset):
    out = tmp_path / "plan"
    done = subprocess.run([sys.executable, "-m", "autopar.cli", "plan", "--hf", os.path.join(CONFIGS, config),
                           "--world", str(world), "--batch", batch, "--preset", preset, "--out", str(out),
                           "--ranks", "1"], capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    plan = autopar.Plan.load(str(out))
    browser, why = _browser()
    if browser is None:
        pytest.skip(why)
    try:
        browser.get((out / "report.html").as_uri())
        errors = [e for e in browser.get_log("browser") if e.get("level") == "SEVERE"]
        assert not errors, errors
        rows = browser.execute_script("return document.querySelectorAll('#regions tbody tr').length")
        boxes = browser.execute_script("return document.querySelectorAll('g.region').length")
        assert rows == boxes == len(plan.regions)
        assert browser.find_element("id", "count").text == str(len(plan.regions))
        if os.environ.get("AUTOPAR_REPORT_SCREENSHOT"):  # docs/images: the page as a user first sees it
            browser.save_screenshot(os.environ["AUTOPAR_REPORT_SCREENSHOT"] + f"-{config.split('.')[0]}.png")
        last = plan.regions[-1].region
        browser.execute_script("arguments[0].dispatchEvent(new MouseEvent('click', {bubbles: true}))",
                               browser.find_elements("css selector", "g.region")[-1])
        hit = browser.execute_script("return Array.from(document.querySelectorAll('tr.hit'))"
                                     ".map(r => r.getAttribute('data-region'))")
        assert len(hit) == 1 and hit[0] in {c.region for c in plan.regions}, hit
        assert re.search(r"predicted step", browser.find_element("tag name", "body").text), last
    finally:
        browser.quit()


def test_the_golden_check_passes_unchanged_names_a_change_and_accepts_it(tmp_path, monkeypatch, capsys):
    from autopar.planning.golden import PlanChangedError
    from autopar.testing import assert_plan_unchanged
    from examples.factories import training_case
    golden = str(tmp_path / "golden")

    def planned(layers, strategy):
        factory, inputs, target, loss = training_case("gpt2", layers=layers)
        torch.manual_seed(0)
        return autopar.plan(factory(), 4, inputs, loss, strategy, example_target=target, hardware="cpu-gloo")

    with pytest.raises(PlanChangedError, match="no golden plan at"):
        assert_plan_unchanged(planned(2, {"data": 2, "tensor": 2}), golden, ranks=2)
    monkeypatch.setenv("AUTOPAR_ACCEPT", "false")  # not an acceptance
    with pytest.raises(PlanChangedError, match="no golden plan at"):
        assert_plan_unchanged(planned(2, {"data": 2, "tensor": 2}), golden, ranks=2)
    other = tmp_path / "not-a-golden"  # accepting into a directory of other files refuses, deleting nothing
    other.mkdir()
    (other / "keep.txt").write_text("mine")
    with pytest.raises(PlanChangedError, match="holds files but no plan.json"):
        assert_plan_unchanged(planned(2, {"data": 2, "tensor": 2}), str(other), ranks=2, accept=True)
    assert (other / "keep.txt").read_text() == "mine"
    monkeypatch.setenv("AUTOPAR_ACCEPT", "1")
    assert_plan_unchanged(planned(2, {"data": 2, "tensor": 2}), golden, ranks=2)  # written
    monkeypatch.delenv("AUTOPAR_ACCEPT")
    assert sorted(os.listdir(golden))[:3] == ["plan.json", "plan.txt", "rank0.py"]
    assert_plan_unchanged(planned(2, {"data": 2, "tensor": 2}), golden, ranks=2)  # unchanged: passes
    with pytest.raises(PlanChangedError) as caught:  # another plan of the same model
        assert_plan_unchanged(planned(2, {"data": 4}), golden, ranks=2)
    text = str(caught.value)
    assert "mesh: {'data': 2, 'tensor': 2} -> {'data': 4, 'tensor': 1}" in text, text
    assert "--- golden/rank0.py" in text and "AUTOPAR_ACCEPT=1" in text
    with pytest.raises(PlanChangedError) as caught:  # the model changed: a block more
        assert_plan_unchanged(planned(3, {"data": 2, "tensor": 2}), golden, ranks=2)
    assert "(absent) -> megatron" in str(caught.value)
    (tmp_path / "golden" / "notes.md").write_text("reviewed by us")
    assert_plan_unchanged(planned(3, {"data": 2, "tensor": 2}), golden, ranks=2, accept=True)
    assert_plan_unchanged(planned(3, {"data": 2, "tensor": 2}), golden, ranks=2)
    assert (tmp_path / "golden" / "notes.md").is_file()  # a golden's own other files are left
    with pytest.raises(ValueError, match="read back from JSON and cannot build its rank programs"):
        assert_plan_unchanged(autopar.Plan.load(golden), golden, ranks=2)
    # the command: exit 1 with the account on stderr, 0 where unchanged
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
                                  "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                                  "vocab_size": 128}))
    args = ["plan", "--hf", str(config), "--world", "2", "--batch", "4x32", "--strategy", "data=2", "--ranks", "1",
            "--check", str(tmp_path / "cli-golden")]
    assert cli_main(args + ["--accept"]) == 0
    assert cli_main(args) == 0
    assert "equals the golden" in capsys.readouterr().out
    config.write_text(config.read_text().replace('"num_hidden_layers": 2', '"num_hidden_layers": 3'))
    assert cli_main(args) == 1
    assert "decisions changed" in capsys.readouterr().err
