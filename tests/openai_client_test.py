#!/usr/bin/env python3
"""tests/openai_client_test.py — the official `openai` Python client against `fastpath serve`
(stories260K over loopback): chat non-stream, chat stream, completions stream with `stop`,
n=2, usage, vLLM's fields through extra_body (structured_outputs, guided_regex,
continue_final_message, min_tokens), structured output through the client's own `parse` helper (a pydantic model sent
as a strict json_schema, the reply parsed back into it), and tool calls (tool_choice required or
named, plain and streamed), the Responses API (text, stream, function call, responses.parse), and
embeddings. Texts must equal the greedy output of `fastpath generate` for the same prompt.

Run by CTest. Uses the repo's .venv (scripts/setup.sh installs `openai` there); exits 77
(CTest: skipped) with the reason when the client or the test data is missing."""
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

SKIP = 77
root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
venv_python = os.path.join(root, ".venv", "bin", "python")
try:
    import openai  # noqa: F401
except ImportError:
    if os.path.exists(venv_python) and os.path.realpath(sys.prefix) != os.path.realpath(os.path.join(root, ".venv")):
        os.execv(venv_python, [venv_python] + sys.argv)
    print("skipped: the openai package is not installed (scripts/setup.sh puts it in .venv)")
    sys.exit(SKIP)
import openai

fastpath = sys.argv[1]
testdata = os.environ.get("FASTPATH_TESTDATA", os.path.join(root, "..", "shared", "testdata"))
model = os.path.join(testdata, "models", "stories260K", "stories260K.gguf")
if not os.path.exists(model):
    print(f"skipped: test data missing: {model}")
    sys.exit(SKIP)


def greedy(prompt, n):
    out = subprocess.run([fastpath, "generate", "-q", "--temp", "0", "-n", str(n), "-p", prompt, "-m", model],
                         check=True, capture_output=True, text=True).stdout
    return out[:-1] if out.endswith("\n") else out


failures = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        failures.append(what)


with tempfile.TemporaryDirectory() as tmp:
    port_file = os.path.join(tmp, "port")
    server = subprocess.Popen([fastpath, "serve", "-q", "-m", model, "--port", "0", "--port-file", port_file,
                               "--kv-cache-memory", "64MiB", "--max-model-len", "512", "--api-key", "test-key"])
    try:
        for _ in range(1000):
            if os.path.exists(port_file) and open(port_file).read().strip():
                break
            time.sleep(0.01)
        port = int(open(port_file).read())
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="test-key", max_retries=0)
        model_id = client.models.list().data[0].id
        check(model_id == "stories260K.gguf", f"models.list -> {model_id}")

        chat_prompt = "user: Tell me a story\nassistant: "  # the plain fallback template
        want_chat = greedy(chat_prompt, 24)
        messages = [{"role": "user", "content": "Tell me a story"}]

        r = client.chat.completions.create(model=model_id, messages=messages, max_tokens=24, temperature=0)
        check(r.choices[0].message.content == want_chat, "chat non-stream = generate")
        check(r.choices[0].message.role == "assistant" and r.choices[0].finish_reason == "length", "chat role, finish_reason")
        check(r.usage.completion_tokens == 24 and r.usage.prompt_tokens > 0
              and r.usage.total_tokens == r.usage.prompt_tokens + 24, f"chat usage {r.usage}")

        text, usage = "", None
        for chunk in client.chat.completions.create(model=model_id, messages=messages, max_tokens=24, temperature=0,
                                                    stream=True, stream_options={"include_usage": True}):
            if chunk.choices and chunk.choices[0].delta.content:
                text += chunk.choices[0].delta.content
            if chunk.usage:
                usage = chunk.usage
        check(text == want_chat, "chat stream = generate")
        check(usage is not None and usage.completion_tokens == 24, f"chat stream usage {usage}")

        prompt = "Once upon a time"
        want = greedy(prompt, 40)
        stop = want[12:16]
        text, finish = "", None
        for chunk in client.completions.create(model=model_id, prompt=prompt, max_tokens=40, temperature=0, stream=True,
                                               stop=[stop]):
            text += chunk.choices[0].text
            finish = chunk.choices[0].finish_reason or finish
        check(text == want[:want.index(stop)], f"completions stream with stop {stop!r}: {text!r}")
        check(finish == "stop", f"finish_reason {finish}")

        r = client.completions.create(model=model_id, prompt=prompt, max_tokens=40, temperature=0, n=2)
        check(len(r.choices) == 2 and all(c.text == want for c in r.choices), "n=2, both greedy = generate")
        check(r.usage.completion_tokens == 80 and r.usage.prompt_tokens == 5, f"completions usage {r.usage}")

        # Structured output as the client does it: pydantic's schema ($defs, $ref, enums, titles,
        # bounds, a format, a pattern), made strict by the client, and the reply validated back
        # into the model (pydantic checks the bounds, the date and the pattern).
        from typing import Literal

        import pydantic

        import datetime

        class Pet(pydantic.BaseModel):
            kind: Literal["cat", "dog"]
            age: int = pydantic.Field(ge=0, le=20)
            weight: float = pydantic.Field(gt=0, lt=50)

        class Story(pydantic.BaseModel):
            mood: Literal["happy", "sad"]
            pets: list[Pet] = pydantic.Field(max_length=2)
            day: datetime.date
            code: str = pydantic.Field(pattern=r"^[A-Z]{2}-[0-9]{3}$")
            done: bool

        for temperature in (0, 1.0):
            r = client.chat.completions.parse(model=model_id, messages=messages, response_format=Story, max_tokens=400,
                                              temperature=temperature, seed=4)
            parsed = r.choices[0].message.parsed
            check(isinstance(parsed, Story) and r.choices[0].finish_reason == "stop",
                  f"chat.completions.parse at temperature {temperature} -> {r.choices[0].message.content!r}")
        # Tool calling with tool_choice "required": the client's own pydantic tool helper, the call
        # parsed back by the client; and streamed, the call's deltas put together.
        class GetWeather(pydantic.BaseModel):
            city: Literal["Paris", "Oslo"]
            days: int

        r = client.chat.completions.parse(model=model_id, messages=messages, tools=[openai.pydantic_function_tool(GetWeather)],
                                          tool_choice="required", max_tokens=300, temperature=0)
        calls = r.choices[0].message.tool_calls or []
        check(len(calls) == 1 and calls[0].function.name == "GetWeather"
              and isinstance(calls[0].function.parsed_arguments, GetWeather) and r.choices[0].finish_reason == "tool_calls",
              f"tool call through parse -> {calls}")
        name, args, finish = "", "", None
        for chunk in client.chat.completions.create(model=model_id, messages=messages, tools=[openai.pydantic_function_tool(GetWeather)],
                                                    tool_choice={"type": "function", "function": {"name": "GetWeather"}},
                                                    max_tokens=300, temperature=0, stream=True):
            for tc in chunk.choices[0].delta.tool_calls or []:
                name += tc.function.name or ""
                args += tc.function.arguments or ""
            finish = chunk.choices[0].finish_reason or finish
        check(name == "GetWeather" and GetWeather.model_validate_json(args) is not None and finish == "tool_calls",
              f"streamed tool call -> {name} {args!r} {finish}")
        # The Responses API through the client: the chat path's text (the same messages), streamed
        # as typed events, a function call, and structured output parsed back by responses.parse.
        r = client.responses.create(model=model_id, input="Tell me a story", max_output_tokens=24, temperature=0)
        check(r.output_text == want_chat and r.status == "incomplete" and r.usage.output_tokens == 24,
              f"responses.create = generate ({r.status}, {r.usage}) -> {r.output_text!r}")
        text, kinds = "", []
        for event in client.responses.create(model=model_id, input=[{"role": "user", "content": "Tell me a story"}],
                                             max_output_tokens=24, temperature=0, stream=True):
            kinds.append(event.type)
            if event.type == "response.output_text.delta":
                text += event.delta
        check(text == want_chat and kinds[0] == "response.created" and kinds[-1] == "response.incomplete",
              f"responses stream = generate, events {kinds[:3]} ... {kinds[-2:]}")
        weather = {"type": "function", "name": "GetWeather", "parameters": openai.pydantic_function_tool(GetWeather)["function"]["parameters"],
                   "strict": True}
        r = client.responses.create(model=model_id, input="Tell me a story", tools=[weather], tool_choice="required",
                                    max_output_tokens=300, temperature=0)
        calls = [item for item in r.output if item.type == "function_call"]
        check(len(calls) == 1 and calls[0].name == "GetWeather" and GetWeather.model_validate_json(calls[0].arguments) is not None,
              f"responses function call -> {r.output}")
        r = client.responses.parse(model=model_id, input="Tell me a story", text_format=Story, max_output_tokens=400,
                                   temperature=0)
        check(isinstance(r.output_parsed, Story), f"responses.parse -> {r.output_text!r}")
        try:
            client.responses.create(model=model_id, input="x", previous_response_id="resp_1")
            check(False, "previous_response_id is refused")
        except openai.BadRequestError as e:
            check("previous_response_id" in str(e), "previous_response_id is refused naming the field")
        # vLLM's own fields, sent as its users send them through this client (extra_body).
        moods = ["happy", "sad", "very happy"]
        r = client.completions.create(model=model_id, prompt="Lily felt", max_tokens=10, n=3, temperature=1.0, seed=4,
                                      extra_body={"structured_outputs": {"choice": moods}})
        check(all(c.text in moods for c in r.choices), f"structured_outputs choice -> {[c.text for c in r.choices]}")
        r = client.chat.completions.create(model=model_id, messages=messages, max_tokens=10, temperature=1.0, seed=2,
                                           extra_body={"guided_regex": "[0-9]{2}-[a-z]+"})
        check(re.fullmatch("[0-9]{2}-[a-z]+", r.choices[0].message.content or "") is not None,
              f"guided_regex -> {r.choices[0].message.content!r}")
        partial = messages + [{"role": "assistant", "content": "Once upon a time"}]
        r = client.chat.completions.create(model=model_id, messages=partial, max_tokens=8, temperature=0,
                                           extra_body={"continue_final_message": True, "add_generation_prompt": False})
        want_more = greedy(chat_prompt + "Once upon a time", 8)
        check(r.choices[0].message.content == want_more, f"continue_final_message -> {r.choices[0].message.content!r} (want {want_more!r})")
        r = client.completions.create(model=model_id, prompt=prompt, max_tokens=12, temperature=0, logit_bias={"2": 100},
                                      extra_body={"min_tokens": 5})  # 2: stories260K's end of text, pushed to the top
        check(r.usage.completion_tokens == 5 and r.choices[0].finish_reason == "stop", f"min_tokens holds the end back -> {r.usage}")
        try:
            openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="wrong", max_retries=0).models.list()
            check(False, "a wrong API key is refused")
        except openai.AuthenticationError:
            check(True, "a wrong API key is refused")
        try:
            client.completions.create(model=model_id, prompt=prompt, max_tokens=-1)
            check(False, "max_tokens=-1 is refused")
        except openai.BadRequestError as e:
            check("max_tokens" in str(e), "max_tokens=-1 is refused naming the field")

        # Embeddings through the client (it asks for base64 and decodes it itself): the vectors
        # `fastpath embed` prints, unit length; `dimensions` cuts them.
        emb = client.embeddings.create(model=model_id, input=[prompt, "The cat sat"])
        want = [json.loads(line)["embedding"] for line in subprocess.run(
            [fastpath, "embed", "-q", "-m", model, "-p", prompt, "-p", "The cat sat"],
            check=True, capture_output=True, text=True).stdout.splitlines()]
        got = [d.embedding for d in emb.data]
        check(len(got) == 2 and all(len(v) == 64 for v in got), "embeddings: two vectors of 64")
        check(all(abs(a - b) < 1e-6 for v, w in zip(got, want) for a, b in zip(v, w)), "embeddings equal `fastpath embed`'s")
        check(abs(sum(x * x for x in got[0]) - 1) < 1e-5, "embeddings are unit length")
        check(emb.usage.prompt_tokens > 0, "embeddings report usage")
        short = client.embeddings.create(model=model_id, input=prompt, dimensions=8, encoding_format="float")
        check(len(short.data[0].embedding) == 8, "embeddings: dimensions=8 gives 8 values")
    finally:
        server.send_signal(signal.SIGTERM)
        rc = server.wait(timeout=30)
    check(rc == 0, f"server exit status {rc} after SIGTERM")

sys.exit(1 if failures else 0)
