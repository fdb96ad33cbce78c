"""model.name: minilm (issue 70): the pretrained encoder loaded offline from checked files, frozen and shared, LoRA
adapters and a head trained; model.parts splitting them by name; each adapter method's defining property."""
import importlib
import os
import socket

import numpy as np
import pytest
import torch
from conftest import in_process_server, minilm_tree

from fedsim.algorithms import WEIGHTS
from fedsim.config import PartsConfig, validate
from fedsim.core import pretrained
from fedsim.core.protocol import payload_bytes
from fedsim.errors import ConfigError
from fedsim.models import build_model
from fedsim.models.minilm import minilm, pretrained_encoder
from fedsim.models.named_parts import head_by_patterns
from fedsim.models.state import frozen_values

FEDSA = {"body": ["*lora_A*"], "head": ["*lora_B*", "classifier.*"]}  # FedSA-LoRA under fedper
ENCODER_VALUES = 22_566_400  # BertModel without its pooler: what stays frozen on the worker
minilm_module = importlib.import_module("fedsim.models.minilm")  # the package's `minilm` is the model function


def test_the_encoder_loads_from_checked_files_without_a_network_call(monkeypatch):
    reached = []

    def no_network(sock, address, *args):
        reached.append(address)  # recorded: a library that catches the error below would hide it
        raise OSError("this test allows no network")

    checked = []
    original = minilm_module.checked_file
    monkeypatch.setattr(socket.socket, "connect", no_network)
    monkeypatch.setattr(minilm_module, "checked_file", lambda name: checked.append(name) or original(name))
    for name in pretrained.OFFLINE_ENV:
        monkeypatch.delenv(name, raising=False)
    pretrained_encoder.cache_clear()
    try:
        net = minilm(num_classes=3)
        assert reached == []
        assert sorted(checked) == sorted(pretrained.SHA256)
        assert all(os.environ[name] == value for name, value in pretrained.OFFLINE_ENV.items())
        assert not pretrained_encoder().use_kernels  # no compute kernels fetched from the hub
        ids = torch.tensor([[101.0, 2000, 2001, 0, 0], [101, 2002, 0, 0, 0]]).view(2, 1, 1, 5)
        assert net(ids).shape == (2, 3)
    finally:
        pretrained_encoder.cache_clear()  # the next test loads its own, outside this test's patches


def test_only_the_adapters_and_the_head_are_parameters_and_the_encoder_is_shared():
    one, two = minilm(num_classes=3), minilm(num_classes=3)
    trainable = {name: p.numel() for name, p in one.named_parameters()}
    assert sum(n for name, n in trainable.items() if "lora_" in name) == 73_728  # r = 8 on query and value
    assert set(trainable) == set(one.state_dict())  # what travels is what trains
    assert all("lora_" in name or name.startswith("classifier.") for name in trainable)
    assert frozen_values(one) == ENCODER_VALUES
    words = "blocks.0.bert.embeddings.word_embeddings.weight"
    assert dict(one.named_buffers())[words].data_ptr() == dict(two.named_buffers())[words].data_ptr()
    adapter = "blocks.0.bert.encoder.layer.0.attention.self.query.lora_A.default.weight"
    assert dict(one.named_parameters())[adapter] is not dict(two.named_parameters())[adapter]


def test_head_alone_when_no_module_is_targeted():
    net = minilm(num_classes=3, target_modules=[])
    assert [name for name, _ in net.named_parameters()] == ["classifier.weight", "classifier.bias"]


@pytest.mark.parametrize("options, message", [
    ({"r": 0}, "model.options.r: 0 is no LoRA rank"),
    ({"alpha": -1}, "model.options.alpha: -1 is no LoRA scale; give a whole number >= 1"),
    ({"dropout": 1.0}, r"model.options.dropout: 1.0 is no dropout rate; give a number in \[0, 1\)"),
    ({"target_modules": ["query", "attention"]}, "model.options.target_modules: 'attention' is no linear layer of "
                                                 "MiniLM's encoder; choose among dense, key, query, value"),
    ({"rank": 8}, "model.options: minilm has no option 'rank'; give r, alpha, dropout, target_modules"),
])
def test_a_bad_option_is_one_line_naming_it(options, message):
    with pytest.raises(ValueError, match=message):
        build_model("minilm", 3, (1, 1, 8), options=options)


KEYS = ["blocks.0.q.lora_A.weight", "blocks.0.q.lora_B.weight", "classifier.weight", "classifier.bias"]


def test_parts_split_tensors_by_name():
    assert head_by_patterns(KEYS, PartsConfig(**FEDSA), "minilm") == KEYS[1:]


@pytest.mark.parametrize("parts, message", [
    ({"body": ["*lora_A*", "*lora_C*"], "head": ["*lora_B*", "classifier.*"]},
     r"model.parts.body\[1\]: '\*lora_C\*' names no tensor of minilm"),
    ({"body": ["*lora*"], "head": ["*lora_B*", "classifier.*"]},
     "model.parts: blocks.0.q.lora_B.weight is named by body '\\*lora\\*' and by head '\\*lora_B\\*'"),
    ({"body": ["*lora_A*"], "head": ["classifier.*"]},
     "model.parts: blocks.0.q.lora_B.weight is named by no pattern of body or head"),
])
def test_every_tensor_is_named_once_and_every_pattern_names_one(parts, message):
    with pytest.raises(ConfigError, match=message):
        head_by_patterns(KEYS, PartsConfig(**parts), "minilm")


@pytest.mark.parametrize("other, message", [({"head": ["classifier"]}, "model.parts and model.head both name"),
                                            ({"personal_layers": 2}, "model.parts replaces model.personal_layers")])
def test_parts_is_the_one_split_of_a_run(tmp_path, other, message):
    tree = minilm_tree(tmp_path, **{"model.parts": FEDSA, **{f"model.{k}": v for k, v in other.items()}})
    with pytest.raises(ValueError, match=message):
        validate(tree)


def test_a_parts_runs_written_config_reads_back(tmp_path):
    """A run folder's config.yaml holds every field, K_P at its default among them: a resumed or kept run reads it."""
    cfg = validate(minilm_tree(tmp_path, **{"model.parts": FEDSA}))
    assert validate(cfg.model_dump()).model.parts == cfg.model.parts


def one_round(tmp_path, algorithm, parts=None, **over):
    """A round of ``algorithm`` over 3 in-process clients: (the server, its round's result)."""
    extra = {} if parts is None else {"model.parts": parts}
    server = in_process_server(validate(minilm_tree(tmp_path, algorithm, **extra, **over)))
    server.restore(None)
    return server, server.round(1)


def layouts(server):
    return server.plan.model.layouts["shared"], server.plan.model.layouts["personal"]


def personal_vectors(server):
    runtime = server.pool.workers[0].runtime
    return [runtime.states.stored("personal", c) for c in sorted(runtime.client_data)]


def test_fedsa_lora_shares_the_a_matrices_and_keeps_b_and_the_head(tmp_path):
    server, result = one_round(tmp_path, "fedper", FEDSA)
    shared, personal = layouts(server)
    assert shared.keys and all("lora_A" in key for key in shared.keys)
    assert personal.keys and all("lora_B" in key or key.startswith("classifier.") for key in personal.keys)
    # Only the A matrices travel: 6 layers x (query, value) x r=4 x 384, never the 22.6 M frozen values.
    assert shared.size == 6 * 2 * 4 * 384
    assert {r["bytes_up"] for r in result.comm} == {payload_bytes(shared.size)}
    kept = personal_vectors(server)
    assert all(not np.array_equal(a, b) for i, a in enumerate(kept) for b in kept[i + 1:])
    b_part = personal.arrays(kept[0])
    assert any(np.any(b_part[key] != 0) for key in personal.keys if "lora_B" in key)  # B starts at 0 and trained


def test_fedper_lora_shares_every_adapter_and_keeps_the_head(tmp_path):
    server, _ = one_round(tmp_path, "fedper", {"body": ["*lora_*"], "head": ["classifier.*"]})
    shared, personal = layouts(server)
    assert personal.keys == ("classifier.weight", "classifier.bias")
    assert len(shared.keys) == 6 * 2 * 2
    assert not np.array_equal(server.state[WEIGHTS], server.plan.model.initial["shared"])


def test_fedavg_lora_shares_adapters_and_head(tmp_path):
    server, _ = one_round(tmp_path, "fedavg")
    shared, personal = layouts(server)
    assert personal.size == 0 and "classifier.weight" in shared.keys
    assert not np.array_equal(server.state[WEIGHTS], server.plan.model.initial["shared"])


def test_fedbabu_lora_trains_the_adapters_under_a_fixed_head(tmp_path):
    server, _ = one_round(tmp_path, "fedbabu", {"body": ["*lora_*"], "head": ["classifier.*"]})
    net = server.pool.workers[0].runtime.net
    initial = server.plan.model.layouts["full"].arrays(server.plan.model.initial["full"])
    state = {key: value.numpy() for key, value in net.state_dict().items()}
    assert np.array_equal(state["classifier.weight"], initial["classifier.weight"])
    assert any(not np.array_equal(state[key], initial[key]) for key in state if "lora_B" in key)


def test_local_lora_shares_nothing_and_each_client_keeps_its_own(tmp_path):
    server, result = one_round(tmp_path, "local")
    assert layouts(server)[0].size == 0 and server.state[WEIGHTS].size == 0
    kept = personal_vectors(server)
    assert not np.array_equal(kept[0], kept[1])


def test_ditto_lora_keeps_a_personal_model_beside_the_global_one(tmp_path):
    server, _ = one_round(tmp_path, "ditto")
    runtime = server.pool.workers[0].runtime
    personal_models = [runtime.states.stored("personal_model", c) for c in sorted(runtime.client_data)]
    assert all(m is not None and not np.array_equal(m, server.state[WEIGHTS]) for m in personal_models)


def test_the_frozen_encoder_is_bit_equal_to_the_pretrained_file_after_training(tmp_path):
    from safetensors.torch import load_file

    server, _ = one_round(tmp_path, "fedper", FEDSA)
    weights = load_file(pretrained.checked_file("model.safetensors"))
    bert = server.pool.workers[0].runtime.net.blocks[0].bert
    held = {name.replace(".base_layer", ""): tensor for name, tensor in bert.named_buffers()}
    compared = [key for key in weights if key in held]
    assert sum(weights[key].numel() for key in compared) >= ENCODER_VALUES - 512  # all but position ids
    assert all(torch.equal(held[key], weights[key]) for key in compared)


def test_lora_runs_are_bit_identical_on_one_and_three_workers(tmp_path):
    """With LoRA dropout on: its draws come from torch's global generator, seeded per client and round
    (fedsim.client.randomness.global_draws), so what else a worker's process drew before (here: the three
    workers share this process, and draws in between stand for the others' work) changes nothing."""
    finals = []
    for workers in (1, 3):
        cfg = validate(minilm_tree(tmp_path / str(workers), "fedper", **{
            "model.parts": FEDSA, "model.options.dropout": 0.1, "engine.workers": workers}))
        server = in_process_server(cfg)
        server.restore(None)
        records = []
        for r in (1, 2):
            torch.rand(997 * (workers - 1))  # another history of the process's generator
            records.append(server.round(r).records)
        personal = sorted((c, worker.runtime.states.stored("personal", c).tobytes())
                          for worker in server.pool.workers for c in worker.runtime.client_data)
        finals.append((server.state[WEIGHTS].copy(), records, personal))
    (one, scored_one, kept_one), (three, scored_three, kept_three) = finals
    assert np.array_equal(one, three) and scored_one == scored_three and kept_one == kept_three


def test_dry_run_counts_only_what_travels(tmp_path):
    from fedsim.engine.estimate import describe, estimate

    e = estimate(validate(minilm_tree(tmp_path, "fedper", **{"model.parts": FEDSA})))
    assert e.shared_values == 6 * 2 * 4 * 384 and e.bytes_up_per_round == 3 * payload_bytes(e.shared_values)
    assert f"{ENCODER_VALUES:,} pretrained values frozen (never trained or sent)" in describe(e)


def test_central_dp_noises_the_shared_adapters_alone(tmp_path):
    dp = {"dp": "central", "noise_multiplier": 1.0, "clip_norm": 0.01, "delta": 0.01}
    plain, _ = one_round(tmp_path / "plain", "fedper", FEDSA, **{"train.weighting": "uniform"})
    private, _ = one_round(tmp_path / "dp", "fedper", FEDSA, privacy=dp, **{"train.weighting": "uniform"})
    assert not np.allclose(private.state[WEIGHTS], plain.state[WEIGHTS], atol=1e-4)  # clipped and noised
    # The personal B matrices and heads never leave the clients: DP leaves them as they trained.
    assert all(np.array_equal(a, b) for a, b in zip(personal_vectors(private), personal_vectors(plain)))


def test_parts_split_a_users_module_by_name_too(tmp_path):
    from conftest import lightning_tree, plan_for

    parts = {"body": ["body.*"], "head": ["head.weight"]}  # the bias left out: named by no part
    with pytest.raises(ConfigError, match="model.parts: head.bias is named by no pattern of body or head"):
        plan_for(validate(lightning_tree(tmp_path, "TwoPartModule", **{"model.parts": parts})))
    parts["head"].append("head.bias")
    keys = plan_for(validate(lightning_tree(tmp_path, "TwoPartModule", **{"model.parts": parts}))).model.keys
    assert keys.head == ("head.weight", "head.bias") and keys.body == ("body.1.weight", "body.1.bias")

