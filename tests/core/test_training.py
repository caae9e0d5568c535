"""Masked-LoRA SFT on the tiny model: the prompt cache is the base model's, training lowers the loss,
the adapter changes only response logits, save/load round-trips, and a stopped run resumes exactly."""
import json

import pytest
import torch

from core.adapters import lora as adapters
from core.config import SftArgs
from core.data.sft import encode_example, example_from_row, gsm8k_example, traces_from_eval
from core.data.train import TrainRecord
from core.decode.cache import new_cache
from core.training.masked_sft import masked_lora_loss, train_sft
from tests.tiny import make_model, make_tokenizer

GSM_ROW = {"question": "Natalia sold 48 clips in April and half as many in May. How many in total?",
           "answer": "In May she sold 48/2 = <<48/2=24>>24 clips.\nIn total 48+24 = <<48+24=72>>72.\n#### 72"}


def test_gsm8k_rewrite_strips_calculator_and_boxes_answer():
    ex = gsm8k_example(GSM_ROW)
    assert "<<" not in ex.thinking and "24 clips" in ex.thinking and ex.answer == "The answer is \\boxed{72}."
    math_ex = example_from_row({"problem": "1+1?", "solution": "It is $\\boxed{2}$.", "answer": "2"})
    assert math_ex.gold == "2"
    with pytest.raises(ValueError):
        example_from_row({"instruction": "hi"})


def test_correct_eval_answers_become_trace_rows_for_sft():
    rows = [{"index": 0, "correct": True, "text": "48/2 = 24, 48+24 = 72. So \\boxed{72}.", "thinking": ""},
            {"index": 1, "correct": False, "text": "\\boxed{5}", "thinking": ""},
            {"index": 2, "correct": True, "text": "The answer is 9.", "thinking": "3*3 = 9"},
            {"index": 3, "correct": True, "text": "48/2 = 24, and 48 + 24 = 72, so the", "thinking": ""}]  # cut
    traces = traces_from_eval(rows, {0: ("Q0", "72"), 1: ("Q1", "6"), 2: ("Q2", "9"), 3: ("Q3", "72")})
    assert traces == [{"question": "Q0", "thinking": "48/2 = 24, 48+24 = 72. So 72.", "answer": "72"},
                      {"question": "Q2", "thinking": "3*3 = 9", "answer": "9"}]
    ex = example_from_row(traces[0])  # trace rows are an SFT data format of their own
    assert ex.thinking.endswith("So 72.") and ex.answer == "The answer is \\boxed{72}." and ex.gold == "72"


def test_prompt_opens_the_trace_and_response_closes_it_and_ends_turn():
    """As at inference, `<think>\\n` belongs to the base-encoded prompt; the adapter learns the rest."""
    tok = make_tokenizer()
    prompt, response = encode_example(tok, gsm8k_example(GSM_ROW))
    text = tok.decode(response)
    assert tok.decode(prompt).endswith("<think>\n") and "Think for at most" in tok.decode(prompt)
    assert "<think>" not in text and text.endswith("<|im_end|>") and "</think>" in text


def test_prompt_kv_identical_with_and_without_adapter():
    model = adapters.attach_new(make_model(448), rank=4)
    for p in model.parameters():  # make the adapter non-trivial (B starts at zero)
        if p.requires_grad:
            torch.nn.init.normal_(p, std=0.05)
    ids = torch.randint(5, 300, (1, 12))
    caches = []
    for use_adapter in (False, True):
        cache = new_cache(model.config, "bf16")
        with torch.no_grad(), adapters.base(model):
            model(input_ids=ids, cache=cache, use_cache=True)
        caches.append(cache)
        # decode one step with the adapter on top of the shared prompt cache
        if use_adapter:
            with torch.no_grad():
                adapted = model(input_ids=ids[:, -1:], cache=cache, use_cache=True).logits
    for a, b in zip(caches[0].layers, caches[1].layers, strict=True):
        assert torch.equal(a.keys[:, :, :12], b.keys[:, :, :12]) and torch.equal(a.values[:, :, :12], b.values[:, :, :12])
    with torch.no_grad(), adapters.base(model):
        plain = model(input_ids=ids[:, -1:], cache=caches[0], use_cache=True).logits
    assert not torch.allclose(plain, adapted)  # the adapter does act on response tokens


def test_one_step_lowers_loss_on_fixed_example():
    tok = make_tokenizer()
    model = adapters.attach_new(make_model(448).float(), rank=8)
    prompt, response = encode_example(tok, gsm8k_example(GSM_ROW))
    params = [p for p in model.parameters() if p.requires_grad]
    optim = torch.optim.AdamW(params, lr=1e-2)
    before = masked_lora_loss(model, prompt, response)
    before.backward()
    optim.step()
    optim.zero_grad()
    with torch.no_grad():
        after = masked_lora_loss(model, prompt, response)
    assert after.item() < before.item()


def test_train_sft_end_to_end_saves_loadable_adapter(tiny_store, tmp_path):
    data = tmp_path / "train.jsonl"
    data.write_text("\n".join(json.dumps(GSM_ROW) for _ in range(4)))
    out = tmp_path / "adapter"
    progress = []
    args = SftArgs(data=(str(data),), out=str(out), model_id="tiny-qwen2", precision="w4", examples=4, steps=2,
                   grad_accum=2, rank=4, alpha=8)
    train_sft(args, progress.append, store=tiny_store)
    assert [p.step for p in progress] == [1, 2]
    assert (out / "adapter_model.safetensors").is_file() and (out / "train_log.jsonl").is_file()
    meta = adapters.adapter_meta(out)
    assert meta["base_model"] == "tiny-qwen2" and meta["steps_done"] == 2
    from core.config import EngineConfig
    from core.loading import load_model

    base = load_model(tiny_store.get("tiny-qwen2"), EngineConfig(model_id="tiny-qwen2", precision="w4"))
    loaded = adapters.load_adapter(base, out)
    assert adapters.is_adapted(loaded)
    # continue training the saved adapter: it starts from the saved weights, not from zero
    from safetensors.torch import load_file

    more = tmp_path / "adapter2"
    train_sft(SftArgs(data=(str(data),), out=str(more), model_id="tiny-qwen2", precision="w4", examples=4, steps=1,
                      grad_accum=1, rank=4, alpha=8, lr=1e-9, init_adapter=str(out)), store=tiny_store)
    before, after = load_file(str(out / "adapter_model.safetensors")), load_file(str(more / "adapter_model.safetensors"))
    assert before.keys() == after.keys()
    assert all(torch.allclose(before[k].float(), after[k].float(), atol=1e-2) for k in before)
    assert any(before[k].abs().sum() > 0 for k in before if "lora_B" in k)


def test_skill_record_is_chat_prompt_then_reply_and_training_lowers_its_loss():
    from core.data.sft import encode_record

    tok = make_tokenizer()
    rec = TrainRecord(1, [{"role": "user", "content": "What is SQL?"}], "A language for querying databases.", None, None)
    prompt, response = encode_record(tok, rec, "skill")
    assert tok.decode(prompt).endswith("What is SQL?<|im_end|>\n<|im_start|>assistant\n")
    assert tok.decode(response) == "A language for querying databases.<|im_end|>"
    torch.manual_seed(0)
    model = adapters.attach_new(make_model(448).float(), rank=8)
    optim = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=5e-3)
    losses = []
    for _ in range(4):
        loss = masked_lora_loss(model, prompt, response)
        loss.backward()
        optim.step()
        optim.zero_grad()
        losses.append(loss.item())
    assert losses[-1] < losses[0] and losses == sorted(losses, reverse=True)


def skill_args(tmp_path, **kw):
    data = tmp_path / "skill.jsonl"
    data.write_text("\n".join(json.dumps({"prompt": f"Table {i}?", "response": f"SELECT * FROM t{i};"}) for i in range(6)))
    base = {"data": (str(data),), "out": str(tmp_path / "out"), "kind": "skill", "model_id": "tiny-qwen2",
            "precision": "bf16", "steps": 4, "grad_accum": 1, "rank": 4, "alpha": 8, "lr": 1e-3, "checkpoint_every": 1}
    return SftArgs(**{**base, **kw})


def test_stop_file_checkpoint_then_resume_matches_an_uninterrupted_run(tiny_store, tmp_path):
    from safetensors.torch import load_file

    from core.training.checkpoint import RunDir, load_checkpoint, trainable_state
    from core.training.masked_sft import new_optimizer, setup
    from core.training.sft import run

    args = skill_args(tmp_path)
    whole = RunDir(tmp_path / "whole")
    assert run(args, whole, store=tiny_store) == tmp_path / "out"

    class StopAfterTwo(RunDir):  # the STOP file appears while step 2 runs, as when the window asks for a pause
        def emit(self, event, text=None):
            super().emit(event, text)
            if event["event"] == "progress" and event["step"] == 2:
                (self.path / "STOP").touch()

    paused = StopAfterTwo(tmp_path / "paused")
    assert run(args, paused, store=tiny_store) is None
    events = [json.loads(line) for line in (paused.path / "log.jsonl").read_text().splitlines()]
    assert events[-1]["event"] == "stopped" and events[-1]["step"] == 2 and events[-1]["resumable"]
    # the checkpoint puts back exactly the weights and optimizer state it saved
    prep = setup(args, tiny_store)
    optim = new_optimizer(prep.model, args)
    state = load_checkpoint(paused.checkpoint, prep.model, optim)
    assert state["step"] == 2 and len(state["log"]) == 2
    saved = load_file(str(paused.checkpoint / "adapter.safetensors"))
    assert all(torch.equal(saved[k], v) for k, v in trainable_state(prep.model).items())
    opt_saved = load_file(str(paused.checkpoint / "optimizer.safetensors"))
    for name, value in opt_saved.items():
        _, index, key = name.split(".", 2)
        assert torch.equal(optim.state_dict()["state"][int(index)][key], value)
    # resuming runs steps 3 and 4 only and ends exactly where the uninterrupted run ended
    paused.clear_stop()
    assert run(args, RunDir(paused.path), store=tiny_store, resume=True) == tmp_path / "out"
    tail = [json.loads(line) for line in (paused.path / "log.jsonl").read_text().splitlines()][len(events):]
    assert [e["step"] for e in tail if e["event"] == "progress"] == [3, 4] and tail[-1]["event"] == "saved"
    a, b = load_file(str(whole.checkpoint / "adapter.safetensors")), load_file(str(paused.checkpoint / "adapter.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_cli_refuses_bad_data_with_an_error_event_naming_the_lines(tiny_store, tmp_path, capsys):
    from core.training.sft import main

    data = tmp_path / "bad.jsonl"
    data.write_text('{"prompt": "a", "response": "b"}\n{"prompt": "a"\n{"prompt": "c", "response": ""}\n')
    rc = main(["--data", str(data), "--name", "x", "--model-id", "tiny-qwen2", "--precision", "bf16",
               "--run-dir", str(tmp_path / "run"), "--json-progress"], store=tiny_store)
    events = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert rc == 2 and events[-1]["event"] == "error"
    assert "2 problem(s)" in events[-1]["message"] and "line 2" in events[-1]["message"] and "line 3" in events[-1]["message"]
    with pytest.raises(ValueError, match="--name NAME"):
        main(["--data", str(data), "--run-dir", str(tmp_path / "run")], store=tiny_store)


def test_cli_presets_fill_in_what_flags_leave_out(tmp_path):
    from core.training.sft import PRESETS, args_from_cli, build_parser

    a = build_parser().parse_args(["--data", "f.jsonl", "--name", "sql", "--preset", "quick", "--steps", "5"])
    args = args_from_cli(a)
    assert args.steps == 5 and args.rank == PRESETS["quick"]["rank"] and args.max_tokens == 256
    assert args.kind == "skill" and set(PRESETS) == {"quick", "balanced", "thorough"}
    legacy = args_from_cli(build_parser().parse_args(["--data", "f.jsonl", "--out", "o"]))
    assert legacy.kind == "reasoning" and legacy.steps == SftArgs(data=("x",)).steps


def test_estimate_times_real_steps_leaves_out_the_first_and_saves_nothing(tiny_store, tmp_path, capsys):
    """--estimate trains a few real steps, counts all but the first (warm-up) and scales seconds per token to the
    data's mean example length; no checkpoint, no adapter."""
    from core.adapters.library import AdapterLibrary
    from core.training.sft import ESTIMATE_STEPS, main

    data = tmp_path / "pairs.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"Say {i}", "response": f"{i} " * (1 + i % 5)}) + "\n"
                            for i in range(12)))
    rc = main(["--data", str(data), "--name", "probe", "--model-id", "tiny-qwen2", "--precision", "bf16", "--steps",
               "40", "--run-dir", str(tmp_path / "run"), "--estimate", "--json-progress"], store=tiny_store)
    events = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert rc == 0 and [e["event"] for e in events].count("progress") == ESTIMATE_STEPS
    estimate = events[-1]
    assert estimate["event"] == "estimate" and estimate["seconds_per_step"] > 0
    assert estimate["total_s"] == pytest.approx(40 * estimate["seconds_per_step"], abs=0.5)  # both rounded
    assert not (tmp_path / "run" / "checkpoint").exists() and AdapterLibrary().list("tiny-qwen2") == []


def test_a_log_that_cannot_be_written_is_said_once_and_the_real_error_still_reported(tmp_path, monkeypatch, capsys):
    """A full disk under log.jsonl: every event is still printed, stderr says so once, and fail() reports the run's
    own error instead of raising the log's; a closed stdout does not make fail() raise either."""
    import errno
    import io

    from core.training import checkpoint
    from core.training.checkpoint import RunDir

    def full(file, mode="r", *args, **kwargs):
        if str(file).endswith("log.jsonl") and "a" in mode:
            raise OSError(errno.ENOSPC, "No space left on device", str(file))
        return open(file, mode, *args, **kwargs)

    monkeypatch.setattr(checkpoint, "open", full, raising=False)
    out = io.StringIO()
    rd = RunDir(tmp_path / "run", json_progress=True, out=out)
    rd.emit({"event": "progress", "step": 1})
    rd.emit({"event": "progress", "step": 2})
    assert rd.fail(ValueError("the data has 2 problem(s)")) == 2
    events = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [e["event"] for e in events] == ["progress", "progress", "error"]
    assert events[-1]["message"] == "the data has 2 problem(s)"
    err = capsys.readouterr().err
    assert err.count("cannot write the training log") == 1 and "ponder: the data has 2 problem(s)" in err

    class Closed(io.StringIO):
        def write(self, text):
            raise BrokenPipeError(errno.EPIPE, "Broken pipe")

    assert RunDir(tmp_path / "closed", json_progress=True, out=Closed()).fail(RuntimeError("boom")) == 1
    assert "ponder: boom" in capsys.readouterr().err


def stopping_at_two(path):
    """A RunDir whose user drops a STOP file while step 2 runs (the wizard's Pause)."""
    from core.training.checkpoint import RunDir

    class Stopping(RunDir):
        def emit(self, event, text=None):
            super().emit(event, text)
            if event["event"] == "progress" and event["step"] == 2:
                (self.path / "STOP").touch()

    return Stopping(path)


def test_resume_refuses_data_changed_or_gone_since_the_checkpoint(tiny_store, tmp_path, capsys):
    """The checkpoint keeps the data's hash, the model and the recipe; a resume whose file was edited in place (6
    records became 40 others) or removed is refused with one error line (not resumable), before any step and with
    the checkpoint left as it was. A checkpoint saved before hashes were kept resumes unchecked, as before."""
    from core.data.train import validate_file
    from core.loading import load_tokenizer
    from core.training.checkpoint import CannotResume, RunDir
    from core.training.sft import main, recipe_of, run

    args = skill_args(tmp_path)
    data = tmp_path / "skill.jsonl"
    paused = stopping_at_two(tmp_path / "run")
    assert run(args, paused, store=tiny_store) is None
    state = json.loads((paused.checkpoint / "state.json").read_text())
    report = validate_file(data, load_tokenizer(tiny_store.get("tiny-qwen2").hf_dir), kind="skill")
    assert state["step"] == 2 and state["data_hash"] == report.data_hash and len(state["data_hash"]) == 64
    assert state["model_id"] == "tiny-qwen2" and state["recipe"] == json.loads(json.dumps(recipe_of(args)))
    original = data.read_text()

    data.write_text("\n".join(json.dumps({"prompt": f"Color {i}?", "response": f"blue {i}"}) for i in range(40)))
    logged = len((paused.path / "log.jsonl").read_text().splitlines())
    with pytest.raises(CannotResume, match="changed since the checkpoint"):
        run(args, RunDir(paused.path), store=tiny_store, resume=True)
    assert len((paused.path / "log.jsonl").read_text().splitlines()) == logged  # not even "loaded"
    RunDir(paused.path).write_args({**args.__dict__, "data": list(args.data)})
    capsys.readouterr()
    rc = main(["--resume", "--run-dir", str(paused.path), "--json-progress"], store=tiny_store)
    printed = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert rc == 2 and len(printed) == 1 and printed[0]["event"] == "error" and printed[0]["resumable"] is False
    assert f"the data file {data} changed since the checkpoint" in printed[0]["message"]
    assert "\n" not in printed[0]["message"] and "start the run again" in printed[0]["message"]
    data.unlink()
    with pytest.raises(CannotResume, match="is gone since the checkpoint"):
        run(args, RunDir(paused.path), store=tiny_store, resume=True)
    assert json.loads((paused.checkpoint / "state.json").read_text())["step"] == 2

    data.write_text(original)  # put back as it was: it resumes
    (paused.path / "STOP").unlink(missing_ok=True)
    old = {k: v for k, v in state.items() if k not in ("data_hash", "model_id", "recipe")}
    (paused.checkpoint / "state.json").write_text(json.dumps(old))  # as saved before hashes were kept
    data.write_text(original.replace("Table 5?", "Chair 5?"))
    assert run(args, RunDir(paused.path), store=tiny_store, resume=True) == tmp_path / "out"  # no hash: no check
    steps = [json.loads(line).get("step") for line in (paused.path / "log.jsonl").read_text().splitlines()
             if json.loads(line)["event"] == "progress"]
    assert steps == [1, 2, 3, 4]


def test_resume_with_a_command_for_other_settings_is_refused_and_the_wizard_check_names_them(tiny_store, tmp_path,
                                                                                             capsys):
    """`--resume` trains what args.json says; a command that names other data, model or recipe is refused rather
    than silently training the old run, and `saved_run_differences` tells the wizard what differs."""
    from core.training.sft import args_from_cli, build_parser, main, saved_run_differences

    data, other = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    for path in (data, other):
        path.write_text(json.dumps({"prompt": "hi", "response": "hello"}) + "\n")
    run_dir = tmp_path / "run"
    cmd = ["train", "sft", "--data", str(data), "--name", "helper", "--model-id", "tiny-qwen2", "--precision", "bf16",
           "--kind", "skill", "--preset", "quick", "--steps", "5", "--held-out", "0.1", "--json-progress"]
    assert saved_run_differences(run_dir, cmd) == ["settings"]  # no saved run
    run_dir.mkdir()
    saved = args_from_cli(build_parser().parse_args(cmd[2:]))
    (run_dir / "args.json").write_text(json.dumps(saved.__dict__))

    def with_(flag, value):
        out = list(cmd)
        out[out.index(flag) + 1] = value
        return out

    assert saved_run_differences(run_dir, cmd) == [] == saved_run_differences(run_dir, cmd + ["--resume"])
    assert saved_run_differences(run_dir, cmd + ["--checkpoint-every", "1", "--eval-tokens", "9"]) == []
    assert saved_run_differences(run_dir, with_("--data", str(other))) == ["data file"]
    assert saved_run_differences(run_dir, with_("--model-id", "qwen2.5-0.5b-instruct")) == ["model"]
    assert saved_run_differences(run_dir, with_("--steps", "6")) == ["recipe"]
    assert saved_run_differences(run_dir, with_("--preset", "thorough")) == ["recipe"]
    assert saved_run_differences(run_dir, with_("--kind", "reasoning")) == ["kind"]

    rc = main([*with_("--data", str(other))[2:], "--resume", "--run-dir", str(run_dir)], store=tiny_store)
    event = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert rc == 2 and event["event"] == "error" and event["resumable"] is False
    assert "started with another data file" in event["message"]
