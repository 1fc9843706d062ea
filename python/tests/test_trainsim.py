"""The package against the CLI: same reports, same errors, and its own conveniences."""

import copy
import json
import os
import threading

import pytest

import trainsim
from conftest import ROOT, example

GPT3 = "experiments/core/gpt3-175b-1024xa100.json"
SMALL = "experiments/core/custom-transformer-small.json"
GRADIENT = "experiments/pipetransformer/vit-b16-imagenet-gradient.json"
WHOLE_RUN = "experiments/whole-run/llama3-405b-16k.json"


def load(rel):
    with open(example(rel), encoding="utf-8") as f:
        return json.load(f)


def test_simulate_gpt3_equals_the_cli(cli):
    r = trainsim.simulate(example(GPT3))
    assert r["iteration_s"] > 0
    assert r == cli.json("simulate", GPT3)


def test_simulate_accepts_str_path_and_dict_alike():
    by_path = trainsim.simulate(str(example(SMALL)))
    by_dict = trainsim.simulate(load(SMALL))
    assert by_path == by_dict
    assert by_path["plan"]["dp"] == 2 and by_path["devices"] == 8


def test_relative_files_resolve_against_the_scenario_folder():
    by_path = trainsim.simulate(example(GRADIENT))
    scenario = load(GRADIENT)
    by_dict = trainsim.simulate(scenario, base_dir=example(GRADIENT).parent)
    assert by_path == by_dict
    # From the repository root the trace beside the scenario is not found, and the error
    # says which file.
    cwd = os.getcwd()
    try:
        os.chdir(ROOT)
        with pytest.raises(ValueError, match="vit-b16-synthetic-gradients.json"):
            trainsim.simulate(scenario)
    finally:
        os.chdir(cwd)


def test_invalid_key_raises_value_error_with_the_clis_message(cli, tmp_path):
    bad = load(SMALL)
    bad["plan"]["tp"] = 0
    with pytest.raises(ValueError) as dict_error:
        trainsim.simulate(bad)
    assert "plan.tp" in str(dict_error.value)
    f = tmp_path / "bad.json"
    f.write_text(json.dumps(bad))
    with pytest.raises(ValueError) as path_error:
        trainsim.simulate(f)
    code, _, err = cli("simulate", str(f))
    assert code == 2
    # The CLI prints "error: MESSAGE"; the package raises MESSAGE, with the file for a file.
    assert err.strip() == f"error: {path_error.value}"
    assert str(path_error.value) == f"{f}: {dict_error.value}"


def test_unknown_key_names_its_path():
    bad = load(SMALL)
    bad["training"]["global_btach"] = 64
    with pytest.raises(ValueError, match=r"training\.global_btach"):
        trainsim.simulate(bad)


def test_unreadable_file_raises_os_error(tmp_path):
    with pytest.raises(OSError, match="cannot read scenario"):
        trainsim.simulate(tmp_path / "missing.json")


def test_not_a_scenario_raises_type_error():
    with pytest.raises(TypeError):
        trainsim.simulate(42)


def test_options_change_the_report():
    s = load(SMALL)
    fair = trainsim.simulate(s)
    ideal = trainsim.simulate(s, network="ideal")
    assert ideal["iteration_s"] <= fair["iteration_s"]
    full = trainsim.simulate(s, full=True)
    assert full["simulated_devices"] == full["devices"] == 8
    with pytest.raises(ValueError, match="network"):
        trainsim.simulate(s, network="fast")


def test_threads_get_the_same_reports():
    s = load(SMALL)
    want = trainsim.simulate(s)
    got = [None] * 4

    def work(i):
        got[i] = trainsim.simulate(s)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got == [want] * 4


def test_train_run_equals_the_cli(cli):
    r = trainsim.train_run(example(WHOLE_RUN), runs=3, price_per_gpu_hour=2.0)
    for key in ("wall_days", "gpu_hours", "goodput", "interruptions", "devices", "tokens", "epochs", "checkpoint"):
        assert key in r
    assert 0 < r["goodput"]["mean"] <= 1
    assert r["runs"] == 3 and r["devices"] == 16384
    assert r["wall_days"]["p50"] <= r["wall_days"]["p90"]
    assert r["cost_dollars"]["mean"] == pytest.approx(2.0 * r["gpu_hours"]["mean"])
    assert r == cli.json("train-run", WHOLE_RUN, "--runs", "3", "--price-per-gpu-hour", "2")


def test_train_run_refuses_bad_arguments():
    with pytest.raises(ValueError, match="runs"):
        trainsim.train_run(example(WHOLE_RUN), runs=0)
    with pytest.raises(ValueError, match="price_per_gpu_hour"):
        trainsim.train_run(example(WHOLE_RUN), price_per_gpu_hour=-1)
    with pytest.raises(ValueError, match="needs \"run\""):
        trainsim.train_run(example(SMALL))


def test_presets_equal_the_cli(cli):
    p = trainsim.presets()
    assert p == cli.json("presets")
    names = {d["name"] for d in p["devices"]}
    assert "a100-sxm-80gb" in names


def test_partition_and_slices_equal_the_cli(cli):
    bapipe = "experiments/bapipe/vgg16-v100.json"
    e = trainsim.partition(example(bapipe))
    assert e["best"] is not None and e["candidates"]
    assert e == cli.json("partition", bapipe)
    tera = "experiments/terapipe/setting5-gpt3-13b.json"
    p = trainsim.slices(example(tera), granularity=64)
    assert p["latency_s"] > 0
    assert p == cli.json("slices", tera, "--granularity", "64")


def test_capacity_lists_every_policy():
    c = trainsim.capacity(example("experiments/offload/gpt2-10b-gemini.json"))
    assert c["vary"] == "params"
    assert len(c["policies"]) >= 3
    assert all(p["max_params"] > 0 for p in c["policies"])
    with pytest.raises(ValueError, match="vary"):
        trainsim.capacity(example("experiments/offload/gpt2-10b-gemini.json"), vary="width")


def test_search_equals_the_cli_and_validates(cli, tmp_path):
    bad = load(SMALL)
    bad["plan"]["tp"] = 0
    with pytest.raises(ValueError, match="plan.tp"):
        trainsim.search(bad, gpus=8)
    space = load(SMALL)
    space["plan"] = {"pp": 2}
    space["training"].pop("micro_batch", None)
    result = trainsim.search(space, top=3)
    assert 0 < len(result["top"]) <= 3 and result["best"]["fits"]
    # The same best plan as `trainsim search --json`.
    f = tmp_path / "space.json"
    f.write_text(json.dumps(space))
    rc, stdout, stderr = cli("search", str(f), "--top", "3", "--json")
    assert rc == 0, stderr
    out = json.loads(stdout)
    assert result["best"]["plan"] == out["best"]["plan"]
    assert result["best"]["iteration_s"] == out["best"]["iteration_s"]
    assert len(trainsim.to_dataframe(result)) == len(result["top"])
    several = trainsim.search(space, gpus=[8, 16], top=2)
    assert [r["gpus"] for r in several["by_gpus"]] == [8, 16]
    # Framework profiles searched too, as `--frameworks` does; unknown options and names refused.
    profiles = trainsim.search(space, top=3, frameworks=["megatron-core", "deepspeed"])
    assert profiles["best"]["framework"] in ("megatron-core", "deepspeed")
    rc, stdout, stderr = cli("search", str(f), "--top", "3", "--frameworks", "megatron-core,deepspeed", "--json")
    assert rc == 0, stderr
    assert profiles["best"]["iteration_s"] == json.loads(stdout)["best"]["iteration_s"]
    with pytest.raises(ValueError, match="frameworks"):
        trainsim.search(space, frameworks=["megatron"])
    with pytest.raises(ValueError, match="unknown option"):
        trainsim.search(space, framework="deepspeed")


def test_to_dataframe_one_row_per_report():
    pd = pytest.importorskip("pandas")
    reports = []
    for tp in (1, 2, 4):
        s = load(SMALL)
        s["plan"]["tp"] = tp
        s["plan"]["dp"] = 8 // (tp * 2)
        reports.append(trainsim.simulate(s))
    df = trainsim.to_dataframe(reports)
    assert isinstance(df, pd.DataFrame)
    assert df.shape[0] == 3
    for col in ("name", "plan.dp", "plan.tp", "plan.pp", "plan.schedule", "iteration_s", "mfu", "peak_memory_bytes", "fits"):
        assert col in df.columns
    assert list(df["plan.tp"]) == [1, 2, 4]
    assert list(df["iteration_s"]) == [r["iteration_s"] for r in reports]
    assert list(df.columns[:3]) == ["name", "workload", "device"]
    # One report, and a partition exploration's candidates.
    assert trainsim.to_dataframe(reports[0]).shape[0] == 1
    e = trainsim.partition(example("experiments/bapipe/vgg16-v100.json"))
    assert trainsim.to_dataframe(e).shape[0] == len(e["candidates"])
    # A search-like result whose rows hold reports.
    ranked = {"results": [{"rank": i + 1, "report": r} for i, r in enumerate(reports)]}
    df2 = trainsim.to_dataframe(ranked)
    assert list(df2["rank"]) == [1, 2, 3] and list(df2["plan.tp"]) == [1, 2, 4]


def test_dict_input_is_not_mutated():
    s = load(SMALL)
    before = copy.deepcopy(s)
    trainsim.simulate(s)
    assert s == before
