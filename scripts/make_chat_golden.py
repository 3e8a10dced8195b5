#!/usr/bin/env python3
"""Writes the chat-template goldens under tests/golden/chat/ with Python's jinja2 as the oracle.

jinja2 is configured as Hugging Face transformers' _compile_jinja_template configures it:
ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols] plus
its {% generation %} tag),
tojson overridden by json.dumps(ensure_ascii=False, indent, separators, sort_keys=False), and the
globals raise_exception (raises TemplateError) and strftime_now. Templates are rendered as
apply_chat_template renders them: messages, tools=None, documents=None, add_generation_prompt,
then the tokenizer's special tokens map and any extra variables.

  <tokenizer>.json  every tokenizers/*/tokenizer_config.json with a chat template under the test data
                    (../shared/testdata or $FASTPATH_TESTDATA), rendered over CONVERSATIONS, with and
                    without add_generation_prompt. The templates are read from the test data, not copied.
  unit.json         small templates exercising each interpreter feature (UNIT_CASES).
  gpt_oss.json      gpt-oss's template (tests/golden/chat/gpt_oss.jinja: OpenAI's chat_template.jinja of
                    gpt-oss-120b, Apache-2.0, as llama.cpp ships it in models/templates) over CONVERSATIONS
                    and GPT_OSS_CONVERSATIONS (harmony: thinking, reasoning effort, developer messages,
                    tool calls and results). It prints strftime_now("%Y-%m-%d"): rendered with a fixed
                    date, which the test replaces by the day it runs.

Usage (jinja2 from PyPI in a virtual environment outside the repo):
  python3 -m venv /work/.venv-jinja && /work/.venv-jinja/bin/pip install jinja2
  /work/.venv-jinja/bin/python scripts/make_chat_golden.py
"""
import json
import os
import sys
from datetime import datetime
from pathlib import Path

import jinja2
import jinja2.ext
from jinja2.exceptions import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "golden" / "chat"


class GenerationTag(jinja2.ext.Extension):
    """{% generation %}...{% endgeneration %}: transformers tracks assistant spans with it; the text
    renders unchanged."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

    def _render(self, caller):
        return caller()


def make_env():
    def raise_exception(message):
        raise TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(format):
        return datetime.now().strftime(format)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[GenerationTag, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


ENV = make_env()


def render(source, variables):
    """(output, None) or (None, "ErrorType: message")."""
    try:
        return ENV.from_string(source).render(**variables), None
    except RecursionError:
        return None, "RecursionError: nesting too deep"
    except Exception as e:  # noqa: BLE001 - every failure is an expected-error golden
        return None, f"{type(e).__name__}: {e}"


SYSTEM = {"role": "system", "content": "You are a helpful assistant."}
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "City name, e.g. \"Paris\""}},
            "required": ["city"],
        },
    },
}

# name -> (messages, extra template variables)
CONVERSATIONS = {
    "system_user": ([SYSTEM, {"role": "user", "content": "Hello! How are you?"}], {}),
    "user_only": ([{"role": "user", "content": "What is 2+2?"}], {}),
    "multi_turn": (
        [
            SYSTEM,
            {"role": "user", "content": "Name a prime number."},
            {"role": "assistant", "content": "7 is a prime number."},
            {"role": "user", "content": "And one larger than 100?"},
        ],
        {},
    ),
    "multi_turn_no_system": (
        [
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello! How can I help?"},
            {"role": "user", "content": "Tell me a joke."},
            {"role": "assistant", "content": "Why did the chicken cross the road?"},
            {"role": "user", "content": "Why?"},
        ],
        {},
    ),
    "empty_system": ([{"role": "system", "content": ""}, {"role": "user", "content": "Hi there"}], {}),
    "assistant_last": (
        [{"role": "user", "content": "Say hi."}, {"role": "assistant", "content": "Hi!"}],
        {},
    ),
    "unicode": (
        [
            {"role": "system", "content": "Réponds en français — s'il te plaît."},
            {"role": "user", "content": "你好，世界！ 🦙🚀 Привет, мир. ﷽ नमस्ते 😀👍🏽 \u00a0nbsp"},
            {"role": "assistant", "content": "こんにちは 🌍 — ça va? Ünïcödé ✓"},
            {"role": "user", "content": "Ελληνικά και العربية"},
        ],
        {},
    ),
    "quotes_newlines_braces": (
        [
            {"role": "user", "content": "  He said \"hi\" and 'bye'.\nNew line\\n (escaped) {{ not a tag }} {% raw %} {# x #}\n\n"},
            {"role": "assistant", "content": "\n{\"json\": [1, 2, {\"k\": \"v\"}]}\t\n"},
            {"role": "user", "content": "<|im_start|> <s> </s> [INST] tricky tokens [/INST]"},
        ],
        {},
    ),
    "whitespace_only": ([{"role": "user", "content": "   \n\t  "}], {}),
    "thinking_history": (
        [
            {"role": "user", "content": "What is 3*4?"},
            {"role": "assistant", "content": "<think>\n3 times 4 is 12.\n</think>\n\nIt is 12."},
            {"role": "user", "content": "And 5*6?"},
        ],
        {},
    ),
    "reasoning_content_field": (
        [
            {"role": "user", "content": "Q1"},
            {"role": "assistant", "content": "A1", "reasoning_content": "thinking about Q1"},
        ],
        {},
    ),
    "enable_thinking_false": ([{"role": "user", "content": "Quick answer please."}], {"enable_thinking": False}),
    "tool_call_string_args": (
        [
            {"role": "user", "content": "Weather in Paris?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}
                ],
            },
            {"role": "tool", "content": "{\"temperature\": 21, \"unit\": \"C\"}"},
            {"role": "assistant", "content": "It is 21 °C in Paris."},
        ],
        {},
    ),
    "tool_call_dict_args": (
        [
            SYSTEM,
            {"role": "user", "content": "Weather in Paris and Oslo?"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
                    {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Oslo", "n": 2.5}}},
                ],
            },
            {"role": "tool", "content": "21"},
            {"role": "tool", "content": "-3"},
        ],
        {},
    ),
    "tools_available": (
        [SYSTEM, {"role": "user", "content": "What's the weather in Tokyo?"}],
        {"tools": [WEATHER_TOOL]},
    ),
}


def special_tokens_map(cfg):
    """transformers' special_tokens_map: named special tokens that are set, as strings."""
    def text(v):
        if isinstance(v, dict):
            return v.get("content")
        return v

    out = {}
    for key in ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"):
        t = text(cfg.get(key))
        if t:
            out[key] = t
    extra = [text(v) for v in cfg.get("additional_special_tokens") or []]
    extra = [t for t in extra if t]
    if extra:
        out["additional_special_tokens"] = extra
    return out


def select_template(field):
    if isinstance(field, str):
        return field
    for entry in field:
        if entry["name"] == "default":
            return entry["template"]
    raise SystemExit("chat_template list without a 'default' entry")


def render_cases(source, special, conversations, render_fn):
    """Each conversation with and without add_generation_prompt: its expected output or error."""
    cases = []
    for name, (messages, extra) in conversations.items():
        for gen in (True, False):
            variables = {"messages": messages, "tools": None, "documents": None, "add_generation_prompt": gen}
            variables.update(special)
            variables.update(extra)
            out, err = render_fn(source, variables)
            case = {"name": f"{name}{'+gen' if gen else ''}", "messages": messages, "add_generation_prompt": gen}
            if extra:
                case["extra"] = extra
            if err is None:
                case["expected"] = out
            else:
                case["error"] = err
            cases.append(case)
    return cases


def tokenizer_goldens(testdata):
    written = []
    tok_dir = testdata / "tokenizers"
    for cfg_path in sorted(tok_dir.glob("*/tokenizer_config.json")):
        cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
        if not cfg.get("chat_template"):
            continue
        source = select_template(cfg["chat_template"])
        special = special_tokens_map(cfg)
        cases = render_cases(source, special, CONVERSATIONS, render)
        name = cfg_path.parent.name
        doc = {
            "tokenizer": name,
            "config": str(cfg_path.relative_to(testdata)),
            "jinja2": jinja2.__version__,
            "special_tokens": special,
            "cases": cases,
        }
        write(OUT / f"{name}.json", doc)
        ok = sum("expected" in c for c in cases)
        written.append(f"{name}: {ok} renderings, {len(cases) - ok} errors")
    return written


# name -> (template, variables). Expected output (or error) comes from jinja2.
UNIT_CASES = {
    # text, output, comments, whitespace control
    "text_only": ("Hello, world!", {}),
    "trailing_newline_dropped": ("line\n", {}),
    "two_trailing_newlines": ("line\n\n", {}),
    "crlf_normalised": ("a\r\nb\rc{% if true %}\r\nx{% endif %}", {}),
    "print_var": ("Hi {{ name }}!", {"name": "Ada"}),
    "print_types": ("{{ 1 }} {{ 1.5 }} {{ true }} {{ none }} {{ 'x' }} {{ [1, 'a', none, true, 2.0] }} {{ {'k': 'v', 'n': 1} }}", {}),
    "print_tuple": ("{{ (1, 2) }} {{ (1,) }} {{ () }} {{ 1, 2 }}", {}),
    "comment": ("a{# comment #}b{#- strip -#}  c", {}),
    "comment_trim_block": ("a\n  {# c #}\nb", {}),
    "dash_left": ("a   \n  {{- 'b' }}", {}),
    "dash_right": ("{{ 'a' -}}  \n  b", {}),
    "dash_block": ("x \n {%- if true -%} \n y \n {%- endif -%} \n z", {}),
    "trim_blocks": ("{% if true %}\nyes\n{% endif %}\nafter", {}),
    "lstrip_blocks": ("  {% if true %}\n    body\n  {% endif %}\nend", {}),
    "lstrip_not_for_vars": ("  {{ 'v' }}\n", {}),
    "lstrip_plus": ("  {%+ if true %}x{% endif %}", {}),
    "trim_plus": ("{% if true +%}\nx{% endif %}", {}),
    "lstrip_after_text": ("text {% if true %}x{% endif %}", {}),
    "lstrip_tabs": ("\t\t{% if true %}x{% endif %}\n\t{# c #}\ny", {}),
    "raw_block": ("{% raw %}{{ not evaluated }} {% if %}{% endraw %}!", {}),
    "var_dict_braces": ("{{ {'a': {'b': 1}} }}|{{ {'a': {'b': 1}}['a'] }}", {}),
    # literals and expressions
    "string_escapes": (r"""{{ 'a\nb\tc\\d\'e' }}|{{ "q\"q" }}|{{ '\x41\u00e9\U0001F600' }}|{{ '\q' }}|{{ 'con' 'cat' }}""", {}),
    "numbers": ("{{ 1_000 }} {{ 0x1F }} {{ 0o17 }} {{ 0b101 }} {{ 1e3 }} {{ 2.5e-3 }} {{ 1.0 }} {{ 0.1 + 0.2 }} {{ 1e16 }} {{ 1e-5 }} {{ 123456789.123 }}", {}),
    "arithmetic": ("{{ 7 + 3 }} {{ 7 - 10 }} {{ 7 * 3 }} {{ 7 / 2 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 2 ** 10 }} {{ 2 ** -1 }} {{ 7.5 // 2 }} {{ -7.5 % 2 }}", {}),
    "precedence": ("{{ 1 + 2 * 3 }} {{ (1 + 2) * 3 }} {{ -2 ** 2 }} {{ 2 ** 3 ** 2 }} {{ 'a' ~ 2 * 3 }} {{ ('1' ~ 2) + '3' }} {{ not 1 == 2 }} {{ 1 + 1 == 2 and not false }}", {}),
    "string_ops": ("{{ 'a' + 'b' }} {{ 'ab' * 3 }} {{ 3 * 'x' }} {{ 'a' ~ 1 ~ none ~ true }} {{ [1] + [2] }} {{ [0] * 3 }}", {}),
    "concat_undefined": ("[{{ 'a' ~ missing ~ 'b' }}]", {}),
    "comparisons": ("{{ 1 < 2 }} {{ 2 <= 2 }} {{ 3 > 4 }} {{ 'a' < 'b' }} {{ [1, 2] < [1, 3] }} {{ 1 == 1.0 }} {{ true == 1 }} {{ 'a' != 'a' }} {{ 1 < 2 < 3 }} {{ 3 > 2 > 2 }}", {}),
    "in_operator": ("{{ 'b' in 'abc' }} {{ 2 in [1, 2] }} {{ 'k' in {'k': 1} }} {{ 'z' not in 'abc' }} {{ 'x' in missing }}", {}),
    "and_or_values": ("{{ 0 or 'x' }} {{ 'a' and 'b' }} {{ '' and 'b' }} {{ none or [] }} {{ 1 and 0 }}", {}),
    "inline_if": ("{{ 'yes' if x else 'no' }} {{ 'yes' if not x else 'no' }} [{{ 'only' if false }}]", {"x": True}),
    "list_dict_literals": ("{{ [1, [2, 3], {'a': [4]}] }} {{ {'x': 1, 'y': {'z': 2},} }} {{ [1, 2,] }}", {}),
    "attribute_and_item": ("{{ m.role }} {{ m['content'] }} {{ m.missing }}|{{ l[0] }} {{ l[-1] }} {{ l[5] }}|{{ l.0 }}", {"m": {"role": "user", "content": "hi"}, "l": [10, 20, 30]}),
    "nested_access": ("{{ d.a.b[1].c }} {{ d['a']['b'][0] }}", {"d": {"a": {"b": [5, {"c": "deep"}]}}}),
    "slicing": ("{{ 'hello'[1:3] }} {{ 'hello'[::-1] }} {{ 'hello'[-3:] }} {{ l[1:] }} {{ l[:-1] }} {{ l[::2] }} {{ l[::-1] }} {{ l[5:] }} {{ 'héllo wörld'[1:8] }} {{ l[-100:100:3] }}", {"l": [1, 2, 3, 4, 5]}),
    "unicode_strings": ("{{ s|length }} {{ s[0] }} {{ s[-1] }} {{ s|upper }} {{ s|reverse }} {{ s.find('界') }}", {"s": "héllo世界🦙"}),
    "none_attr": ("[{{ n.x }}][{{ n['x'] }}][{{ (1).x }}]", {"n": None}),
    # statements
    "if_elif_else": ("{% for x in [1, 2, 3, 4] %}{% if x == 1 %}one{% elif x == 2 %}two{% elif x == 3 %}three{% else %}many{% endif %} {% endfor %}", {}),
    "for_loop_vars": ("{% for x in 'abc' %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }}|{% endfor %}", {}),
    "for_else": ("{% for x in [] %}x{% else %}empty{% endfor %}|{% for x in [1] %}x{% else %}empty{% endfor %}", {}),
    "for_filter": ("{% for x in range(10) if x is odd %}{{ x }}:{{ loop.index }}/{{ loop.length }} {% endfor %}", {}),
    "for_unpack": ("{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}{% for (a, b) in [[1, 2], [3, 4]] %}{{ a + b }}{% endfor %}", {"d": {"z": 1, "a": 2, "m": 3}}),
    "for_dict_keys": ("{% for k in d %}{{ k }}{% endfor %}", {"d": {"b": 1, "a": 2}}),
    "for_prev_next": ("{% for x in [1, 2, 3] %}[{{ loop.previtem }}|{{ loop.nextitem }}]{% endfor %}", {}),
    "loop_cycle": ("{% for x in range(5) %}{{ loop.cycle('a', 'b', 'c') }}{% endfor %}", {}),
    "nested_loops": ("{% for a in [1, 2] %}{% for b in 'xy' %}{{ a }}{{ b }}{{ loop.index }} {% endfor %}{{ loop.index }}|{% endfor %}", {}),
    "break_continue": ("{% for x in range(10) %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 5 %}{% break %}{% endif %}{{ x }}{% endfor %}", {}),
    "set_scoping": ("{% set x = 0 %}{% for i in [1, 2] %}[{{ x }}]{% set x = i %}({{ x }}){% endfor %}{{ x }}", {}),
    "set_in_if_leaks": ("{% if true %}{% set y = 5 %}{% endif %}{{ y }}", {}),
    "set_tuple": ("{% set a, b = 1, 2 %}{{ a }}{{ b }}{% set c = 1, 2 %}{{ c }}", {}),
    "set_block": ("{% set body %}  Hello {{ name }}  {% endset %}[{{ body }}]{% set t | trim | upper %}  x  {% endset %}[{{ t }}]", {"name": "Bob"}),
    "namespace": ("{% set ns = namespace(count=0, found=false) %}{% for x in [1, 2, 3] %}{% set ns.count = ns.count + x %}{% if x == 2 %}{% set ns.found = true %}{% endif %}{% endfor %}{{ ns.count }} {{ ns.found }}", {}),
    "namespace_from_dict": ("{% set ns = namespace({'a': 1}, b=2) %}{{ ns.a }}{{ ns.b }}{{ ns.c }}", {}),
    "macro": ("{% macro greet(name, punct='!') %}Hello {{ name }}{{ punct }}{% endmacro %}{{ greet('A') }} {{ greet('B', '?') }} {{ greet(name='C', punct='.') }} [{{ greet() }}]", {}),
    "macro_recursive": ("{% macro fact(n) %}{% if n <= 1 %}1{% else %}{{ n * fact(n - 1)|int }}{% endif %}{% endmacro %}{{ fact(5) }}", {}),
    "filter_block": ("{% filter upper %}abc {{ 'def' }}{% endfilter %}", {}),
    "with_block": ("{% with a = 1, b = 2 %}{{ a + b }}{% endwith %}[{{ a }}]", {}),
    "print_tag": ("{% print 'p' ~ 1 %}", {}),
    "generation_tag": ("{% generation %}gen {{ 1 }}{% endgeneration %}", {}),
    # filters
    "filter_trim": ("[{{ '  a b  '|trim }}][{{ 'xxaxx'|trim('x') }}][{{ none|trim }}][{{ missing|trim }}]", {}),
    "filter_tojson": ("{{ d|tojson }}|{{ d|tojson(indent=2) }}|{{ 'é\"\\n\u0001'|tojson }}|{{ [1, 2.0, none, true]|tojson }}|{{ d|tojson(sort_keys=true) }}|{{ {}|tojson(indent=2) }}|{{ 'é'|tojson(ensure_ascii=true) }}|{{ d|tojson(separators=(',', ':')) }}", {"d": {"z": [1, {"y": None}], "a": "ü", "n": 1.5, "e": []}}),
    "filter_tojson_floats": ("{{ [0.1, 1e16, 1e-7, 3.0, -0.0, 12345678.9]|tojson }}", {}),
    "filter_length": ("{{ [1, 2]|length }} {{ 'héllo'|length }} {{ {'a': 1}|count }} {{ missing|length }}", {}),
    "filter_default": ("[{{ missing|default('d') }}][{{ ''|default('d') }}][{{ ''|default('d', true) }}][{{ none|default('d') }}][{{ missing|d }}][{{ 0|default(5, boolean=true) }}]", {}),
    "filter_join": ("{{ [1, 2, 3]|join }} {{ ['a', 'b']|join(', ') }} {{ users|join(', ', attribute='name') }} {{ 'abc'|join('-') }}", {"users": [{"name": "x"}, {"name": "y"}]}),
    "filter_case": ("{{ 'hELLo wORLD'|upper }} {{ 'HeLLo'|lower }} {{ 'hELLO wORLD'|capitalize }} {{ 'hello big-world (x'|title }} {{ 'émile ÇA'|title }}", {}),
    "filter_replace": ("{{ 'aaa'|replace('a', 'b') }} {{ 'aaa'|replace('a', 'b', 2) }} {{ 'ab'|replace('', '-') }} {{ 123|replace('2', 'x') }}", {}),
    "filter_first_last": ("{{ [1, 2, 3]|first }} {{ [1, 2, 3]|last }} {{ 'abc'|first }} [{{ []|first }}] {{ {'k': 1, 'j': 2}|first }}", {}),
    "filter_list_string": ("{{ 'abc'|list }} {{ {'a': 1}|list }} {{ 12|string ~ 'x' }} {{ none|string }}", {}),
    "filter_int_float": ("{{ '42'|int }} {{ ' 7 '|int }} {{ '4.7'|int }} {{ 'x'|int }} {{ 'x'|int(-1) }} {{ 3.9|int }} {{ '0x1A'|int(0, 16) }} {{ '1e3'|float }} {{ 'nan?'|float }} {{ 2|float }} {{ true|int }}", {}),
    "filter_items": ("{% for k, v in d|items %}{{ k }}:{{ v }} {% endfor %}{{ d|items|list }}", {"d": {"b": 1, "a": [2]}}),
    "filter_select": ("{{ users|selectattr('active')|map(attribute='name')|join(',') }}|{{ users|rejectattr('active')|map(attribute='name')|list }}|{{ users|selectattr('role', 'equalto', 'admin')|map(attribute='name')|first }}|{{ [1, 2, 3, 4]|select('even')|list }}|{{ [1, 2, 3]|reject('odd')|list }}|{{ ['a', 'b']|map('upper')|join }}", {"users": [{"name": "a", "active": True, "role": "admin"}, {"name": "b", "active": False, "role": "user"}, {"name": "c", "active": True, "role": "user"}]}),
    "filter_map_default": ("{{ users|map(attribute='age', default=0)|list }}", {"users": [{"age": 3}, {}]}),
    "filter_safe_indent": ("{{ '<b>'|safe }}|{{ 'a\nb\n\nc'|indent }}|{{ 'a\nb'|indent(2, true) }}|{{ 'a\n\nb'|indent(width='> ', blank=true) }}", {}),
    "filter_round_abs": ("{{ 2.5|round }} {{ 3.5|round }} {{ 2.675|round(2) }} {{ 2.1|round(0, 'ceil') }} {{ 2.9|round(method='floor') }} {{ -3|abs }} {{ -2.5|abs }} {{ 7|round }} {{ 1.23456|round(3) }}", {}),
    "filter_unique_sort": ("{{ [3, 1, 2, 1, 3]|unique|list }} {{ ['b', 'A', 'a', 'B']|unique|list }} {{ [3, 1, 2]|sort }} {{ [3, 1, 2]|sort(reverse=true) }} {{ ['b', 'A', 'c']|sort }} {{ users|sort(attribute='n')|map(attribute='n')|list }}", {"users": [{"n": 2}, {"n": 1}]}),
    "filter_min_max_sum": ("{{ [3, 1, 2]|min }} {{ [3, 1, 2]|max }} {{ [1, 2, 3]|sum }} {{ [1.5, 2]|sum }} {{ items|sum(attribute='v') }} {{ ['b', 'A']|max }}", {"items": [{"v": 1}, {"v": 5}]}),
    "filter_dictsort": ("{{ {'b': 1, 'A': 2, 'c': 0}|dictsort }} {{ {'b': 1, 'a': 2}|dictsort(by='value') }}", {}),
    "filter_misc": ("{{ '<a href=\"x\">&'|e }} {{ 'a b  c'|wordcount }} {{ [1, 2, 3, 4, 5]|batch(2)|list }} {{ 'x'|center(5) }}| {{ '%s-%05.1f-%d' % ('a', 2.25, 7) }} {{ '%s and %s'|format('x', 'y') }} {{ [1, 2]|reverse|list }}", {}),
    "filter_guards_falsy": ("{{ none|selectattr('a')|list }}{{ none|map('upper')|list }}{{ ''|select|list }}{{ none|rejectattr('x', 'none')|list }}", {}),
    "markup_escapes_on_plus": ("{{ ('<b>'|safe) + '<i>\"' }}|{{ '<i>' + ('<b>'|safe) }}|{{ ('x'|safe) ~ '<' }}|{{ ('a'|safe) * 2 + '&' }}|{{ ('<'|e) + '<' }}|{{ ('<'|e) is escaped }}|{{ '<' is escaped }}|{{ (\"'\"|safe + d|tojson) }}", {"d": {"k": "v'"}}),
    "set_block_with_filter_block": ("{%- set s -%}\n{%- filter trim -%}\n  text\n\n{%- endfilter -%}\n{%- endset -%}[{{ s }}]{% set ns = namespace(calls=[]) %}{% for c in ['a', 'b'] %}{% set ns.calls = ns.calls + ['<' ~ c ~ '>'] %}{% endfor %}{{ ns.calls|join(', ') }}", {}),
    # tests
    "tests": ("{{ x is defined }} {{ y is defined }} {{ y is undefined }} {{ n is none }} {{ x is string }} {{ d is mapping }} {{ l is iterable }} {{ l is sequence }} {{ 3 is number }} {{ 3 is integer }} {{ 3.0 is float }} {{ true is boolean }} {{ x is not none }} {{ 4 is even }} {{ 3 is odd }} {{ 9 is divisibleby 3 }} {{ 'ab' is lower }} {{ 'AB' is upper }} {{ 2 is in [1, 2] }} {{ 1 is eq 1 }} {{ 1 is lt 2 }} {{ 'upper' is filter }} {{ 'none' is test }} {{ false is false }} {{ 1 is true }} {{ y is iterable }} {{ x is callable }}", {"x": "s", "n": None, "d": {}, "l": [1]}),
    "test_in_condition": ("{% if m.tool_calls is defined and m.tool_calls %}tools{% else %}none{% endif %}", {"m": {"role": "assistant"}}),
    # str methods
    "str_methods": ("{{ '  x  '.strip() }}|{{ 'xxyxx'.strip('x') }}|{{ '  x'.lstrip() }}|{{ 'x  '.rstrip() }}|{{ '\\n\\nx\\n'.lstrip('\\n') }}|{{ 'abc'.startswith('ab') }}|{{ 'abc'.endswith(('x', 'c')) }}|{{ 'a,b,,c'.split(',') }}|{{ ' a  b '.split() }}|{{ 'a b c'.split(' ', 1) }}|{{ 'a b c'.rsplit(' ', 1) }}|{{ 'aXbX'.replace('X', '-') }}|{{ 'abc'.upper() }}|{{ 'ABC'.lower() }}|{{ 'hello world'.title() }}|{{ 'they\\'re 1st'.title() }}|{{ 'abcabc'.find('c') }}|{{ 'abc'.find('z') }}|{{ 'abcabc'.rfind('b') }}|{{ 'abcabc'.count('bc') }}|{{ 'hello'.capitalize() }}", {}),
    "str_methods_more": ("{{ '-'.join(['a', 'b']) }}|{{ '{} and {}'.format(1, 'x') }}|{{ '{0}{1}{0}'.format('a', 'b') }}|{{ '{name}:{n:>4}'.format(name='k', n=7) }}|{{ '{:.2f}'.format(3.14159) }}|{{ 'x'.center(5, '*') }}|{{ '42'.zfill(5) }}|{{ 'a=b=c'.partition('=') }}|{{ 'a\\nb\\r\\nc'.splitlines() }}|{{ '123'.isdigit() }}|{{ 'ab'.isalpha() }}|{{ ' '.isspace() }}|{{ 'Ab'.swapcase() }}|{{ 'prefix_x'.removeprefix('prefix_') }}", {}),
    "content_split_think": ("{% set c = m.split('</think>')[-1].lstrip('\\n') %}{% set r = m.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') %}[{{ r }}][{{ c }}]", {"m": "<think>\nplan\n</think>\n\nanswer"}),
    # dict methods and globals
    "dict_methods": ("{{ d.keys()|list }} {{ d.values()|list }} {{ d.items()|list }} {{ d.get('a') }} {{ d.get('zz') }} {{ d.get('zz', 'dflt') }} {{ d['items'] }}", {"d": {"a": 1, "b": 2, "items": "field"}}),
    "globals": ("{{ range(3)|list }} {{ range(1, 7, 2)|list }} {{ range(3, 0, -1)|list }} {{ dict(a=1, b='x') }} {{ strftime_now('no directives') }}", {}),
    "raise_exception_not_called": ("{% if false %}{{ raise_exception('nope') }}{% endif %}ok", {}),
    # undefined behaviour
    "undefined_prints_empty": ("[{{ missing }}][{{ missing is defined }}][{% if missing %}t{% else %}f{% endif %}][{% for x in missing %}x{% endfor %}]", {}),
    "missing_key_is_undefined": ("[{{ m.nope }}][{{ m['nope'] is defined }}][{{ m.nope is none }}]", {"m": {}}),
    # errors (expected to fail in both)
    "error_unclosed_block": ("{% if true %}never closed", {}),
    "error_unclosed_for": ("{% for x in y %}", {}),
    "error_unclosed_var": ("{{ 1 + ", {}),
    "error_unclosed_comment": ("{# never closed", {}),
    "error_unclosed_string": ("{{ 'abc }}", {}),
    "error_unknown_tag": ("{% frobnicate %}", {}),
    "error_endfor_without_for": ("{% endfor %}", {}),
    "error_unknown_filter": ("{{ 1|no_such_filter }}", {}),
    "error_unknown_test": ("{{ 1 is no_such_test }}", {}),
    "error_raise_exception": ("{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}", {}),
    "error_undefined_attr": ("{{ missing.attr }}", {}),
    "error_undefined_call": ("{{ missing() }}", {}),
    "error_undefined_arith": ("{{ missing + 1 }}", {}),
    "error_type_add": ("{{ 'a' + 1 }}", {}),
    "error_none_add": ("{{ none + 'a' }}", {}),
    "error_div_zero": ("{{ 1 / 0 }}", {}),
    "error_not_iterable": ("{% for x in 3 %}{% endfor %}", {}),
    "error_ns_assign_non_namespace": ("{% set x = 1 %}{% set x.a = 2 %}", {}),
    "error_unsafe_method": ("{{ l.append(1) }}", {"l": [1]}),
    "error_join_non_str": ("{{ ''.join(['a', 1]) }}", {}),
    "error_break_outside_loop": ("{% break %}", {}),
    "error_bad_bracket": ("{{ [1, 2) }}", {}),
    "error_range_too_big": ("{{ range(1000000)|length }}", {}),
    "error_tojson_undefined": ("{{ missing|tojson }}", {}),
    "error_compare_types": ("{{ 1 < 'a' }}", {}),
    "error_unpack": ("{% for a, b in [[1, 2, 3]] %}{% endfor %}", {}),
    "error_deep_parens": ("{{ " + "(" * 1000 + "1" + ")" * 1000 + " }}", {}),
    "error_deep_blocks": ("{% if true %}" * 600 + "x" + "{% endif %}" * 600, {}),
    "error_in_string_requires_string": ("{{ 1 in 'abc' }}", {}),
}


def unit_goldens():
    cases = []
    for name, (source, variables) in UNIT_CASES.items():
        out, err = render(source, variables)
        case = {"name": name, "template": source, "vars": variables}
        if err is None:
            case["expected"] = out
        else:
            case["error"] = err
        if name.startswith("error_") != (err is not None):
            raise SystemExit(f"unit case {name}: expected {'an error' if name.startswith('error_') else 'success'}, got {err or repr(out)}")
        cases.append(case)
    write(OUT / "unit.json", {"jinja2": jinja2.__version__, "cases": cases})
    return f"unit: {len(cases)} cases"


def write(path, doc):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")


GPT_OSS_DATE = "2026-12-06"
GPT_OSS_CONVERSATIONS = {
    "thinking_field": (
        [
            {"role": "user", "content": "What is 3*4?"},
            {"role": "assistant", "content": "12.", "thinking": "3 times 4 is 12."},
            {"role": "user", "content": "And 5*6?"},
        ],
        {},
    ),
    "reasoning_effort_high": ([{"role": "user", "content": "Prove it."}], {"reasoning_effort": "high"}),
    "developer_and_identity": (
        [{"role": "developer", "content": "Answer in one word."}, {"role": "user", "content": "Color of the sky?"}],
        {"model_identity": "You are a terse assistant."},
    ),
    "tool_call_with_thinking": (
        [
            {"role": "user", "content": "Weather in Paris?"},
            {
                "role": "assistant",
                "thinking": "I should call get_weather.",
                "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}],
            },
            {"role": "tool", "content": "{\"temperature\": 21}"},
        ],
        {"tools": [WEATHER_TOOL]},
    ),
    "channel_tags_in_content": (
        [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "<|channel|>final<|message|>Hello"}],
        {},
    ),
}


def gpt_oss_golden():
    path = OUT / "gpt_oss.jinja"
    source = path.read_text(encoding="utf-8")
    special = {"bos_token": "<|startoftext|>", "eos_token": "<|return|>", "pad_token": "<|endoftext|>"}
    env = make_env()
    env.globals["strftime_now"] = lambda fmt: datetime(2026, 12, 6).strftime(fmt)

    def render_fixed_date(src, variables):
        try:
            return env.from_string(src).render(**variables), None
        except Exception as e:  # noqa: BLE001 - every failure is an expected-error golden
            return None, f"{type(e).__name__}: {e}"

    cases = render_cases(source, special, {**CONVERSATIONS, **GPT_OSS_CONVERSATIONS}, render_fixed_date)
    doc = {"tokenizer": "gpt_oss", "template": "gpt_oss.jinja", "date": GPT_OSS_DATE, "jinja2": jinja2.__version__,
           "special_tokens": special, "cases": cases}
    write(OUT / "gpt_oss.json", doc)
    ok = sum("expected" in c for c in cases)
    return f"gpt_oss: {ok} renderings, {len(cases) - ok} errors"


def main():
    testdata = Path(os.environ.get("FASTPATH_TESTDATA") or ROOT.parent / "shared" / "testdata")
    if not (testdata / "tokenizers").is_dir():
        sys.exit(f"test data not found: {testdata}/tokenizers")
    only = set(sys.argv[1:])
    if only == {"gpt_oss"}:
        print(gpt_oss_golden())
        return
    for line in tokenizer_goldens(testdata) + [unit_goldens(), gpt_oss_golden()]:
        print(line)


if __name__ == "__main__":
    main()
