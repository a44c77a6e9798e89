"""The front door's pure parts (experiments.serve.front_door): the chat template, the parameters greedy decoding
honours, OpenAI's error shape, and the shipped tokenizers' sizes (the served API is tested for real in
tests/emulation/test_serve.py)."""

import json

import pytest
from tokenizers import Tokenizer

from experiments.serve import front_door as serve_http
from experiments.serve.front_door import ApiError, chat_prompt
from workers.model import CONFIGS, precision_base

from experiments.serve.session import TOKENIZERS  # noqa: E402


def test_the_chat_template_and_bad_messages():
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": [{"type": "text", "text": "hi"}]}]
    assert chat_prompt(msgs) == "<|system|>\nbe brief\n<|user|>\nhi\n<|assistant|>\n"
    for bad, where in (([], "messages"), ([{"role": "user"}], "messages[0]"), ([{"content": "x"}], "messages[0]")):
        with pytest.raises(ApiError) as info:
            chat_prompt(bad)
        assert info.value.status == 400 and info.value.param == where


@pytest.mark.parametrize(
    "body,param",
    [({"n": 2}, "n"), ({"temperature": 0.7}, "temperature"), ({"stop": ["\n"]}, "stop"), ({"tools": []}, "tools")],
)
def test_parameters_greedy_decoding_cannot_honour_are_refused(body, param):
    with pytest.raises(ApiError) as info:
        serve_http._check_fields(body)
    assert (info.value.status, info.value.param, info.value.code) == (400, param, "unsupported_parameter")


def test_greedy_values_and_harmless_fields_pass():
    serve_http._check_fields(
        {
            "model": "m",
            "prompt": "x",
            "temperature": 0,
            "n": 1,
            "stop": None,
            "stream": True,
            "stream_options": {"include_usage": True},
            "mode": "pdd",
            "ignore_eos": True,
        }
    )


def test_the_error_body_is_openais_shape():
    resp = ApiError(404, "no such model", "model", "model_not_found").response()
    assert resp.status == 404
    assert json.loads(resp.body) == {
        "error": {
            "message": "no such model",
            "type": "invalid_request_error",
            "param": "model",
            "code": "model_not_found",
        }
    }


@pytest.mark.parametrize("model", sorted(CONFIGS))
def test_each_model_has_a_tokenizer_of_its_vocab_size_that_round_trips_text(model):
    tok = Tokenizer.from_file(str(TOKENIZERS / precision_base(model) / "tokenizer.json"))
    assert tok.get_vocab_size() == CONFIGS[model].vocab_size
    text = "PDD: Prefill -> Relay Decode -> Main Decode, über das WAN."
    assert tok.decode(tok.encode(text).ids) == text
    assert tok.decode([CONFIGS[model].vocab_size - 1])  # every id the model may sample decodes to something
    config = json.loads((TOKENIZERS / precision_base(model) / "tokenizer_config.json").read_text())
    assert (
        config["vocab_size"] == CONFIGS[model].vocab_size and config["model_max_length"] == CONFIGS[model].max_seq_len
    )
