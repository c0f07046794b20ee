#!/usr/bin/env python3
"""Writes cases.json: random conversations and the prompt DeepSeek's reference encoder renders for each.

Usage: make_cases.py DIR_WITH_encoding_dsv32.py [N] > cases.json

The encoder is DeepSeek's encoding/encoding_dsv32.py (DeepSeek-V3.2 repository); it is not part of megactx. Request
tools are attached as megactx does (docs/chat-formats.md): to the first message when it is a system message, else
to an empty system message put first. Conversations the reference refuses (its assertions) are skipped.
"""
import json
import random
import sys

sys.path.insert(0, sys.argv[1])
import encoding_dsv32 as ref  # noqa: E402

N = int(sys.argv[2]) if len(sys.argv) > 2 else 60
rng = random.Random(3200)
TEXTS = ["Hi", "What's the weather in Paris?", "line one\nline two", "  padded  ", "日本語のテキスト", "emoji 🙂 ok",
         "quotes \" and \\ backslash", "<b>tags</b> & <think>", "x" * 40, "Tab\there"]
VALUES = ["Oslo", "", "multi\nline", "ünïcödé", 3, -1.5, 0, True, False, None, [1, "two", None], {"a": {"b": [1, 2]}},
          {}, [], 1e21, "{\"json\": \"text\"}"]
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather for a city",
                                      "parameters": {"type": "object", "properties": {
                                          "city": {"type": "string"}, "days": {"type": "integer"}},
                                          "required": ["city"]}}},
    {"type": "function", "function": {"name": "search", "description": "Sök på webben — “quoted”",
                                      "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
                                      "strict": True}},
    {"type": "function", "function": {"name": "noop", "parameters": {"type": "object", "properties": {}}}},
]


def text():
    return rng.choice(TEXTS)


def tool_call():
    args = {f"k{i}": rng.choice(VALUES) for i in range(rng.randrange(0, 4))}
    return {"id": f"call_{rng.randrange(10**6)}", "type": "function",
            "function": {"name": rng.choice(["get_weather", "search", "noop"]),
                         "arguments": json.dumps(args, ensure_ascii=rng.random() < 0.5)}}


def conversation():
    msgs = []
    if rng.random() < 0.6:
        msgs.append({"role": "system", "content": text()})
    for _ in range(rng.randrange(1, 4)):
        msgs.append({"role": rng.choice(["user", "user", "developer"]), "content": text()})
        for _ in range(rng.randrange(0, 3)):
            a = {"role": "assistant"}
            if rng.random() < 0.7:
                a["content"] = text()
            elif rng.random() < 0.5:
                a["content"] = None
            if rng.random() < 0.6:
                a["reasoning_content"] = text()
            n_calls = rng.randrange(0, 3)
            if n_calls:
                a["tool_calls"] = [tool_call() for _ in range(n_calls)]
            msgs.append(a)
            n_results = n_calls if rng.random() < 0.9 else rng.randrange(0, n_calls + 1)
            for i in range(n_results):
                msgs.append({"role": "tool", "tool_call_id": a["tool_calls"][i]["id"], "content": text()})
            if n_calls and n_results < n_calls:
                break
    return msgs


def render(messages, tools, thinking):
    msgs = json.loads(json.dumps(messages))
    if tools:
        if msgs and msgs[0]["role"] == "system":
            msgs[0]["tools"] = tools
        else:
            msgs.insert(0, {"role": "system", "tools": tools})
    return ref.encode_messages(msgs, thinking_mode="thinking" if thinking else "chat", drop_thinking=True)


cases = []
while len(cases) < N:
    messages = conversation()
    tools = rng.sample(TOOLS, rng.randrange(0, 3))
    thinking = rng.random() < 0.5
    try:
        expected = render(messages, tools, thinking)
    except (AssertionError, IndexError):
        continue
    cases.append({"thinking": thinking, "tools": tools, "messages": messages, "expected": expected})
json.dump(cases, sys.stdout, ensure_ascii=False, indent=1)
sys.stdout.write("\n")
