"""``etmlx serve`` as clients meet it: a real server process on a free port, driven by
the official ``openai`` client (and raw HTTP for what a client library would not send).
The model is a tiny random-weight checkpoint exported here; its chat template shows the
tools it is given, in the Hermes / Qwen way."""

import json
import random
import threading
import time

import pytest
from PIL import Image

import etmlx
from etmlx.cli import main
from etmlx.llm import generation
from etmlx.llm.chat import Chat, template_ids
from examples import llm
from servers import health, image_part, post, serving

CONTEXT = 1024
TOOLS_TEMPLATE = (
    "{% if tools %}<s>system: you may call {{ tools | tojson }}</s>{% endif %}"
    "{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}"
    "{% for c in m.tool_calls or [] %}<tool_call>{{ c.function | tojson }}</tool_call>{% endfor %}</s>{% endfor %}"
    "{% if add_generation_prompt %}<s>assistant: {% endif %}"
)
WEATHER = {"type": "function", "function": {"name": "weather", "description": "the weather in a city", "parameters": {
    "type": "object", "additionalProperties": False, "required": ["city", "unit"],
    "properties": {"city": {"type": "string", "maxLength": 6}, "unit": {"enum": ["c", "f"]}}}}}
TIME = {"type": "function", "function": {"name": "time", "parameters": {
    "type": "object", "additionalProperties": False, "required": ["zone"],
    "properties": {"zone": {"type": "integer", "minimum": -12, "maximum": 14}}}}}


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """(the server's base URL, the .pte, its tokenizer); the server stops with the module."""
    from transformers import AutoTokenizer

    checkpoint = llm.tiny_checkpoint(tmp_path_factory.mktemp("checkpoint"), max_cache=CONTEXT)
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    tokenizer.chat_template = TOOLS_TEMPLATE
    tokenizer.save_pretrained(checkpoint)
    out = tmp_path_factory.mktemp("tiny")
    assert main(["export-llm", checkpoint, "-o", str(out / "model.pte"), "--max-seq-len", "16"]) == 0
    with serving(out / "model.pte") as url:
        yield url, out / "model.pte", generation.load_tokenizer(str(out))


@pytest.fixture(scope="module")
def client(served):
    from openai import OpenAI

    return OpenAI(base_url=served[0], api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def local(served):
    """The same .pte loaded in this process, for what the server should answer."""
    return generation.Session(etmlx.load(served[1]))


def test_models_and_health(served, client):
    assert [m.id for m in client.models.list().data] == ["tiny"]
    assert health(served[0])["status"] == "ok"


def test_greedy_chat_equals_etmlx_chat_plain_and_streamed(served, client, local):
    _, _, tokenizer = served
    chat = Chat(local, tokenizer, max_new_tokens=20)
    first, second = "".join(chat.reply("hello")), "".join(chat.reply("how are you"))
    messages = [{"role": "user", "content": "hello"}]
    reply = client.chat.completions.create(model="tiny", messages=messages, max_tokens=20, temperature=0)
    assert reply.choices[0].message.content == first
    messages += [{"role": "assistant", "content": first}, {"role": "user", "content": "how are you"}]
    chunks = list(client.chat.completions.create(model="tiny", messages=messages, max_tokens=20, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == second
    assert chunks[0].choices[0].delta.role == "assistant" and chunks[-2].choices[0].finish_reason in ("stop", "length")
    usage = chunks[-1].usage  # the last chunk: no choices, the usage
    assert not chunks[-1].choices and usage.completion_tokens == chat.stats.generated_tokens
    assert usage.prompt_tokens == len(template_ids(tokenizer, messages))
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens


def test_completions_as_text_and_token_ids_with_logprobs(client, local, served):
    tokenizer = served[2]
    ids = tokenizer.encode("the quick brown fox")
    local.position = 0
    expected = list(generation.generate_tokens(local, ids, 10, stop_at_eos=False))
    reply = client.completions.create(model="tiny", prompt="the quick brown fox", max_tokens=10, logprobs=3)
    choice = reply.choices[0]
    assert choice.text == tokenizer.decode(expected, skip_special_tokens=True) and reply.usage.prompt_tokens == len(ids)
    assert [tokenizer.decode([t]) for t in expected] == choice.logprobs.tokens
    for chosen, logprob, top in zip(choice.logprobs.tokens, choice.logprobs.token_logprobs, choice.logprobs.top_logprobs):
        assert len(top) == 3 and top[chosen] == logprob == max(top.values()) < 0  # greedy: the likeliest
    by_ids = client.completions.create(model="tiny", prompt=ids, max_tokens=10)
    assert by_ids.choices[0].text == choice.text


def test_a_stop_string_ends_the_reply(client):
    whole = client.completions.create(model="tiny", prompt="hello world", max_tokens=16).choices[0].text
    stop = whole[6:8]
    cut = client.completions.create(model="tiny", prompt="hello world", max_tokens=16, stop=[stop]).choices[0]
    assert cut.text == whole[: whole.index(stop)] and cut.finish_reason == "stop"


def test_sampling_is_repeatable_by_seed_and_penalties_change_it(client):
    def text(**settings):
        return client.completions.create(model="tiny", prompt="hello", max_tokens=16, **settings).choices[0].text

    assert text(temperature=1.0, seed=3) == text(temperature=1.0, seed=3) != text(temperature=1.0, seed=4)
    assert text(temperature=1.0, seed=-7) == text(temperature=1.0, seed=-7)  # any integer, as OpenAI takes
    assert text(frequency_penalty=2.0) != text()


def test_concurrent_clients_get_their_own_replies(served, client):
    prompts = ["hello", "the lazy dog", "tokens in, text out", "a model on a mac"]
    alone = {p: client.completions.create(model="tiny", prompt=p, max_tokens=12).choices[0].text for p in prompts}
    together = {}

    def ask(prompt):
        stream = client.completions.create(model="tiny", prompt=prompt, max_tokens=12, stream=True)
        together[prompt] = "".join(chunk.choices[0].text for chunk in stream)

    threads = [threading.Thread(target=ask, args=(p,)) for p in prompts * 2]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert together == alone


def test_a_conversation_prefills_only_its_new_tokens_across_requests(client):
    def turn(messages):
        reply = client.chat.completions.create(model="tiny", messages=messages, max_tokens=8)
        return reply.choices[0].message.content, reply.usage

    first = [{"role": "user", "content": "hello there"}]
    text, usage = turn(first)
    second = first + [{"role": "assistant", "content": text}, {"role": "user", "content": "and then"}]
    _, again = turn(second)
    assert again.prompt_tokens_details.cached_tokens >= usage.prompt_tokens  # the first turn's prompt, at least
    turn([{"role": "user", "content": "something else entirely"}])  # writes over the live cache
    _, third = turn(second)  # its cache comes back from the saved ones
    assert third.prompt_tokens_details.cached_tokens == third.prompt_tokens - 1


def test_a_client_that_leaves_cancels_its_generation(served):
    import http.client
    import urllib.parse

    url = served[0]
    body = {"model": "tiny", "prompt": "hello", "max_tokens": 400}
    whole = post(url, body, "/completions")[1]["usage"]["completion_tokens"]
    assert whole > 60  # what the request costs when its client stays
    before = health(url)["generated_tokens"]
    body["stream"] = True
    address = urllib.parse.urlsplit(url)
    connection = http.client.HTTPConnection(address.hostname, address.port, timeout=60)
    connection.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    response = connection.getresponse()
    assert response.status == 200 and response.readline().startswith(b"data: ")
    connection.close()  # the client goes away after its first chunk
    for _ in range(100):
        state = health(url)
        if state["queued"] == 0:
            status, _ = post(url, {"model": "tiny", "prompt": "x", "max_tokens": 1}, "/completions")
            break
        time.sleep(0.1)
    assert status == 200 and health(url)["generated_tokens"] - before < whole // 2, (whole, health(url), before)


def test_tools_reach_the_template_and_calls_come_back_parsed(client):
    messages = [{"role": "user", "content": "weather?"}]
    plain = client.chat.completions.create(model="tiny", messages=messages, max_tokens=1)
    with_tools = client.chat.completions.create(model="tiny", messages=messages, max_tokens=1, tools=[WEATHER])
    assert with_tools.usage.prompt_tokens > plain.usage.prompt_tokens + 50  # the template wrote the tools in
    for choice, tools in (("required", [WEATHER, TIME]), ({"type": "function", "function": {"name": "time"}}, [WEATHER, TIME])):
        reply = client.chat.completions.create(model="tiny", messages=messages, max_tokens=200, tools=tools,
                                               tool_choice=choice, temperature=1.0, seed=0)
        answer = reply.choices[0]
        assert answer.finish_reason == "tool_calls" and len(answer.message.tool_calls) == 1, answer
        call = answer.message.tool_calls[0].function
        assert _accepts(next(t for t in tools if t["function"]["name"] == call.name)["function"]["parameters"],
                        json.loads(call.arguments))
        if isinstance(choice, dict):
            assert call.name == "time"
    # The call and its result go on in the conversation, through the template.
    history = messages + [{"role": "assistant", "content": None, "tool_calls": [answer.message.tool_calls[0].model_dump()]},
                          {"role": "tool", "tool_call_id": answer.message.tool_calls[0].id, "content": "sunny"}]
    reply = client.chat.completions.create(model="tiny", messages=history, max_tokens=4, tools=tools)
    assert reply.usage.prompt_tokens > with_tools.usage.prompt_tokens + len(answer.message.tool_calls[0].function.arguments)


def test_the_executorch_runtime_serves_the_same_replies(served, client):
    """The native runtime behind the server: the same greedy replies, and a conversation's
    saved cache written back into it."""
    from openai import OpenAI

    first = [{"role": "user", "content": "hello there"}]
    second = first + [{"role": "assistant", "content": "x"}, {"role": "user", "content": "more"}]
    with serving(served[1], "--runtime", "executorch") as url:
        native = OpenAI(base_url=url, api_key="unused", max_retries=0)
        for messages in (first, second, [{"role": "user", "content": "other"}], first):
            expected, got = (c.chat.completions.create(model="tiny", messages=messages, max_tokens=12)
                             for c in (client, native))
            assert got.choices[0].message.content == expected.choices[0].message.content
        assert got.usage.prompt_tokens_details.cached_tokens == got.usage.prompt_tokens - 1  # written back


@pytest.mark.parametrize("response_format, schema", [
    ({"type": "json_object"}, {"type": "object"}),
    ({"type": "json_schema", "json_schema": {"name": "answer", "schema": WEATHER["function"]["parameters"]}},
     WEATHER["function"]["parameters"]),
])
def test_response_format_is_enforced_even_from_random_weights(client, response_format, schema):
    for seed in range(3):
        reply = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "json"}],
                                               max_tokens=200, temperature=1.0, seed=seed,
                                               response_format=response_format)
        answer = reply.choices[0]
        assert answer.finish_reason == "stop" and _accepts(schema, json.loads(answer.message.content)), answer


def _accepts(schema: dict, value) -> bool:
    """The few JSON Schema keywords these tests use, checked by hand (no validator here)."""
    if "enum" in schema:
        return value in schema["enum"]
    kind = schema.get("type")
    if kind == "string":
        return isinstance(value, str) and len(value) <= schema.get("maxLength", len(value))
    if kind == "integer":
        return isinstance(value, int) and schema.get("minimum", value) <= value <= schema.get("maximum", value)
    if kind == "object":
        properties = schema.get("properties", {})
        return (isinstance(value, dict) and set(schema.get("required", [])) <= set(value)
                and (schema.get("additionalProperties", True) or set(value) <= set(properties))
                and all(_accepts(properties[k], v) for k, v in value.items() if k in properties))
    return True


@pytest.mark.parametrize("body, route, status, message", [
    (b"{not json", "/chat/completions", 400, "not valid JSON"),
    ([1, 2], "/chat/completions", 400, "not a JSON object"),
    ({"model": "tiny", "messages": [{"role": "user"}]}, "/chat/completions", 400, "a user message needs content"),
    ({"model": "tiny", "messages": []}, "/chat/completions", 400, "messages is empty"),
    ({"model": "gpt-9", "messages": [{"role": "user", "content": "x"}]}, "/chat/completions", 400, "does not exist"),
    ({"model": "tiny", "prompt": "fox " * CONTEXT}, "/completions", 400, "this model's context is 1024"),
    ({"model": "tiny", "prompt": "x", "temperature": 3}, "/completions", 400, "temperature=3: expected a number in [0, 2]"),
    ({"model": "tiny", "prompt": "x", "max_tokens": "9"}, "/completions", 400, "max_tokens: expected a whole number"),
    ({"model": "tiny", "prompt": "x", "n": 2}, "/completions", 400, "one choice per request"),
    ({"model": "tiny", "prompt": "x", "stop": ["a", "b", "c", "d", "e"]}, "/completions", 400, "up to 4"),
    ({"model": "tiny", "prompt": [1, 99999]}, "/completions", 400, "past the vocabulary"),
    ({"model": "tiny", "messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}, "/chat/completions", 400,
     "top_logprobs needs logprobs"),
    ({"model": "tiny", "messages": [{"role": "user", "content": "x"}], "response_format": {"type": "yaml"}},
     "/chat/completions", 400, "response_format type 'yaml'"),
    ({"model": "tiny", "messages": [{"role": "user", "content": "x"}],
      "response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": {"type": "nonsense"}}}},
     "/chat/completions", 400, "schema"),
    ({"model": "tiny", "messages": [{"role": "user", "content": "x"}], "tools": [WEATHER],
      "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "/chat/completions", 400, "not among the tools"),
    ({"model": "tiny", "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
     "/chat/completions", 400, "a data: URL of base64 image bytes"),
    ({"model": "tiny", "messages": [{"role": "user", "content": [image_part(Image.new("RGB", (4, 4)))]}]},
     "/chat/completions", 400, "this model takes no images"),
    ({"model": "tiny", "prompt": "x", "logit_bias": {"5": 10}}, "/completions", 400,
     "logit_bias is not supported by this server"),
    ({}, "/embeddings", 404, "no route /v1/embeddings"),
])
def test_a_bad_request_is_one_openai_shaped_error(served, body, route, status, message):
    got, reply = post(served[0], body, route)
    assert got == status and message in reply["error"]["message"], reply
    assert set(reply["error"]) == {"message", "type", "param", "code"}
    assert post(served[0], {"model": "tiny", "prompt": "x", "max_tokens": 1}, "/completions")[0] == 200


def test_random_json_never_breaks_the_server(served):
    """Bodies of random JSON (and random mutations of a good one): each answered 200 or
    400 with OpenAI's error body, never 500, and the server serves on."""
    rng = random.Random(0)
    goods = ({"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}, {"model": "tiny", "prompt": "hi"})
    fields = ["model", "messages", "prompt", "max_tokens", "temperature", "top_p", "stop", "stream", "logprobs",
              "top_logprobs", "n", "seed", "tools", "tool_choice", "response_format", "presence_penalty",
              "stream_options", "frequency_penalty", "max_completion_tokens", "echo", "top_k", "min_p"]
    plausible = [0, 1, 2, 0.5, 1.5, -1, 20, "auto", "none", "required", ["x"], {"type": "json_object"},
                 {"include_usage": True}, [{"role": "user", "content": "x"}], [WEATHER]]

    def value(depth=0):
        kinds = [None, True, rng.randint(-5, 600), rng.uniform(-3, 3), "", "tiny", "x" * rng.randint(0, 9),
                 float("1e308"), rng.choice(plausible)]
        if depth < 2:
            kinds += [[value(depth + 1) for _ in range(rng.randint(0, 3))],
                      {rng.choice(fields + ["role", "content", "type"]): value(depth + 1) for _ in range(rng.randint(0, 3))}]
        return rng.choice(kinds)

    answered = []
    for case in range(300):
        chat = rng.random() < 0.5
        body = dict(goods[0 if chat else 1]) if case % 4 else {}
        for _ in range(rng.randint(1, 3)):
            body[rng.choice(fields)] = value()
        body["max_tokens"] = 2
        body.pop("max_completion_tokens", None)
        route = "/chat/completions" if chat else "/completions"
        if body.get("stream") is True:
            body["stream"] = False
        status, reply = post(served[0], body, route)
        assert status in (200, 400), (body, reply)
        assert status == 200 or set(reply["error"]) == {"message", "type", "param", "code"}
        answered.append(status)
    assert answered.count(200) > 20 and answered.count(400) > 20  # both the checks and the model were reached
    assert health(served[0])["status"] == "ok"
