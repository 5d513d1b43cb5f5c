"""Drives a running mtplx server with the official `openai` and `anthropic` clients.

Usage: MTPLX_BASE_URL=http://127.0.0.1:PORT python3 check_sdks.py
Exits non-zero (with the failing check) on the first mismatch.
"""

import json
import os

import anthropic
import openai

BASE = os.environ["MTPLX_BASE_URL"]
KEY = os.environ.get("MTPLX_API_KEY", "none")
MODEL = os.environ.get("MTPLX_MODEL_ID", "SmolLM2-135M-Instruct")
Q = "What is the capital of France?"
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


def check(cond, what):
    if not cond:
        raise SystemExit(f"FAILED: {what}")
    print(f"ok: {what}")


def openai_checks():
    client = openai.OpenAI(base_url=f"{BASE}/v1", api_key=KEY, max_retries=0)

    models = client.models.list()
    check([m.id for m in models.data] == [MODEL], "models.list names the served model")

    chat = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": Q}], temperature=0, max_tokens=24
    )
    text = chat.choices[0].message.content
    check("Paris" in text, f"chat.completions answers Paris ({text!r})")
    check(chat.usage.prompt_tokens_details.cached_tokens == 0, "usage has cached_tokens")

    stream = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": Q}],
        temperature=0,
        max_tokens=24,
        stream=True,
        stream_options={"include_usage": True},
    )
    parts, usage = [], None
    for chunk in stream:
        if chunk.usage:
            usage = chunk.usage
        for c in chunk.choices:
            parts.append(c.delta.content or "")
    check("".join(parts) == text, "streamed chat equals the whole answer")
    check(usage is not None and usage.completion_tokens == chat.usage.completion_tokens, "stream usage")

    comp = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=6, temperature=0)
    check(len(comp.choices[0].text) > 0, "completions.create returns text")

    # A tool-call round trip: the client sends back the call and its result.
    history = [
        {"role": "user", "content": "What is the weather in Paris?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": json.dumps({"city": "Paris"})}}
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"},
    ]
    answer = client.chat.completions.create(model=MODEL, messages=history, tools=[WEATHER], temperature=0, max_tokens=24)
    choice = answer.choices[0]
    check(choice.finish_reason in ("stop", "length", "tool_calls"), "tool round trip answers")
    for call in choice.message.tool_calls or []:
        json.loads(call.function.arguments)
        check(call.type == "function", "parsed tool calls are well formed")

    resp = client.responses.create(model=MODEL, input=Q, temperature=0, max_output_tokens=24)
    check("Paris" in resp.output_text, f"responses.create answers Paris ({resp.output_text!r})")
    events = list(client.responses.create(model=MODEL, input=Q, temperature=0, max_output_tokens=24, stream=True))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    check(deltas == resp.output_text, "streamed responses equal the whole answer")
    check(events[-1].type == "response.completed", "responses stream ends with response.completed")
    fn_tool = {"type": "function", "name": "get_weather", "parameters": WEATHER["function"]["parameters"]}
    resp = client.responses.create(
        model=MODEL,
        input=[
            {"role": "user", "content": "What is the weather in Paris?"},
            {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{\"city\": \"Paris\"}"},
            {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
        ],
        tools=[fn_tool],
        temperature=0,
        max_output_tokens=16,
    )
    check(resp.status in ("completed", "incomplete"), "responses tool round trip")

    try:
        client.chat.completions.create(model="gpt-nope", messages=[{"role": "user", "content": "hi"}])
        check(False, "unknown model raises")
    except openai.NotFoundError as e:
        check(e.body["code"] == "model_not_found", "unknown model is NotFoundError")
    try:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=0)
        check(False, "max_tokens=0 raises")
    except openai.BadRequestError as e:
        check(e.body["param"] == "max_tokens", "max_tokens=0 is BadRequestError")


def anthropic_checks():
    # Recent SDKs no longer take sampling arguments; the server still reads them.
    greedy = {"extra_body": {"temperature": 0}}
    client = anthropic.Anthropic(base_url=BASE, api_key=KEY, max_retries=0)
    msg = client.messages.create(
        model=MODEL, max_tokens=24, messages=[{"role": "user", "content": Q}], **greedy
    )
    text = msg.content[0].text
    check("Paris" in text, f"messages.create answers Paris ({text!r})")
    check(msg.stop_reason == "end_turn", "stop_reason end_turn")
    with client.messages.stream(
        model=MODEL, max_tokens=24, messages=[{"role": "user", "content": Q}], **greedy
    ) as stream:
        streamed = "".join(stream.text_stream)
        final = stream.get_final_message()
    check(streamed == text, "streamed messages equal the whole answer")
    check(final.usage.output_tokens == msg.usage.output_tokens, "stream usage")
    count = client.messages.count_tokens(model=MODEL, messages=[{"role": "user", "content": Q}])
    check(count.input_tokens == msg.usage.input_tokens, "count_tokens matches usage")
    tool = {"name": "get_weather", "description": "Weather", "input_schema": WEATHER["function"]["parameters"]}
    reply = client.messages.create(
        model=MODEL,
        max_tokens=16,
        tools=[tool],
        messages=[
            {"role": "user", "content": "What is the weather in Paris?"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"}]},
        ],
        **greedy,
    )
    check(reply.stop_reason in ("end_turn", "max_tokens", "tool_use"), "messages tool round trip")
    try:
        client.messages.create(model="claude-nope", max_tokens=4, messages=[{"role": "user", "content": "hi"}])
        check(False, "unknown model raises")
    except anthropic.NotFoundError:
        check(True, "unknown model is NotFoundError")


openai_checks()
anthropic_checks()
print("all SDK checks passed")
