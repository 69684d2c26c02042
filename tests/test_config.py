from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from gateway.config.load import default_config, interpolate_env, load_config, parse_config
from gateway.config.schema import ConfigError
from gateway.describe import describe
from gateway.upstream.routes import Router

EXAMPLE = Path(__file__).parent.parent / "config.example.yaml"


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return path


def test_env_references_are_replaced_and_defaults_apply() -> None:
    tree = {"a": "${KEY}", "b": ["x-${MISSING:-fallback}"], "c": 3}
    assert interpolate_env(tree, {"KEY": "secret"}) == {"a": "secret", "b": ["x-fallback"], "c": 3}


def test_missing_env_variable_names_the_key_and_variable() -> None:
    with pytest.raises(ConfigError, match=r"upstreams\.0\.api_key: .*OPENAI_KEY is not set"):
        interpolate_env({"upstreams": [{"api_key": "${OPENAI_KEY}"}]}, {})


def test_invalid_value_names_the_key_and_what_was_given(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "upstreams:\n  - name: a\n    base_url: http://x\n    timeouts: {idle: soon}\n",
    )
    with pytest.raises(ConfigError) as exc:
        load_config(path)
    assert "upstreams.0.timeouts.idle" in str(exc.value)
    assert "'soon'" in str(exc.value)


def test_unknown_keys_are_rejected(tmp_path: Path) -> None:
    path = write(tmp_path, "upstreams:\n  - name: a\n    base_url: http://x\n    bogus: 1\n")
    with pytest.raises(ConfigError, match=r"upstreams\.0\.bogus: Extra inputs"):
        load_config(path)


def test_route_to_unknown_upstream_is_rejected() -> None:
    data = {
        "upstreams": [{"name": "a", "base_url": "http://x"}],
        "routes": [{"match": "*", "upstream": "a", "fallbacks": [{"upstream": "b"}]}],
    }
    with pytest.raises(ConfigError, match="names upstream 'b', which is not defined"):
        parse_config(data)


def test_base_url_must_be_http() -> None:
    with pytest.raises(ConfigError, match=r"upstreams\.0\.base_url"):
        parse_config({"upstreams": [{"name": "a", "base_url": "ftp://x"}]})


def test_not_yaml_and_missing_file_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(write(tmp_path, "upstreams: [unclosed"))
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "absent.yaml")


def test_embedded_defaults_read_gateway_variables_only() -> None:
    config = default_config({"OPENAI_BASE_URL": "http://gateway-itself/v1"})
    assert config.upstreams[0].base_url == "https://api.openai.com/v1"
    assert config.upstreams[0].api_key is None
    config = default_config(
        {"GATEWAY_UPSTREAM_BASE_URL": "http://vllm:8000/v1", "GATEWAY_UPSTREAM_API_KEY": "k"}
    )
    assert config.upstreams[0].base_url == "http://vllm:8000/v1"
    assert [r.upstream for r in config.effective_routes] == ["anthropic", "gemini", "default"]


def test_embedded_defaults_send_messages_to_anthropic_and_the_rest_to_the_default() -> None:
    config = default_config({"GATEWAY_ANTHROPIC_API_KEY": "sk-ant-k"})
    router = Router(config)
    assert router.resolve("claude-sonnet-4-5", "messages").legs[0].upstream.name == "anthropic"
    assert router.resolve("gpt-4o", "chat").legs[0].upstream.name == "default"
    assert router.resolve("gpt-4o", "responses").legs[0].upstream.name == "default"
    assert router.default_leg().upstream.name == "default"  # /v1/models and the like
    anthropic = config.upstream("anthropic")
    assert anthropic.api_root == "https://api.anthropic.com/v1"
    assert anthropic.api_key is not None and anthropic.api_key.get_secret_value() == "sk-ant-k"


def test_embedded_defaults_send_gemini_to_google() -> None:
    config = default_config({"GATEWAY_GEMINI_API_KEY": "AIza-k", "GEMINI_API_KEY": "client-side"})
    router = Router(config)
    assert router.resolve("gemini-2.5-pro", "gemini").legs[0].upstream.name == "gemini"
    assert router.resolve("gemini-2.5-pro", "chat").legs[0].upstream.name == "default"
    gemini = config.upstream("gemini")
    assert gemini.api_root == "https://generativelanguage.googleapis.com/v1beta"
    assert gemini.api_key is not None and gemini.api_key.get_secret_value() == "AIza-k"
    url = default_config({"GATEWAY_GEMINI_BASE_URL": "http://g:9/v1beta"}).upstream("gemini")
    assert url.api_root == "http://g:9/v1beta" and url.api_key is None


def test_describe_masks_every_secret() -> None:
    config = parse_config(
        {
            "upstreams": [
                {
                    "name": "openai",
                    "base_url": "https://api.openai.com/v1",
                    "api_key": "sk-live-abcdefghijklmnop1234",
                    "headers": {"x-org-token": "org-secret-value-99"},
                }
            ],
            "auth": {"keys": ["gw-key-zzzzzzzzzzzz"]},
            "state": {"redis_url": "redis://:hunter2@redis:6379/0"},
        }
    )
    text = describe(config)
    for secret in ("sk-live-abcdefghijklmnop", "org-secret-value", "gw-key-zzzz", "hunter2"):
        assert secret not in text
    assert "****1234" in text
    assert "redis://:****@redis:6379/0" in text
    assert "*: openai/<requested>" in text


def test_example_config_is_valid_and_documents_every_key() -> None:
    env = {"OPENAI_API_KEY": "sk-1", "OPENROUTER_API_KEY": "sk-2", "GATEWAY_KEY": "gw"}
    config = load_config(EXAMPLE, env)
    text = EXAMPLE.read_text()
    for key in _keys(config.model_dump()):
        assert f"{key}:" in text, f"config.example.yaml does not mention {key!r}"


def _keys(node: object) -> set[str]:
    if isinstance(node, dict):
        return set(node) | {k for v in node.values() for k in _keys(v)}
    if isinstance(node, list):
        return {k for v in node for k in _keys(v)}
    return set()


def test_embedded_defaults_take_gateway_keys_from_the_environment() -> None:
    config = default_config({"GATEWAY_UPSTREAM_API_KEY": "sk-x", "GATEWAY_KEYS": "k1, k2,"})
    assert [k.get_secret_value() for k in config.auth.keys] == ["k1", "k2"]
    assert default_config({}).auth.keys == []


def test_describe_shows_how_each_leg_is_protected() -> None:
    config = parse_config(
        {
            "upstreams": [
                {
                    "name": "up",
                    "base_url": "http://u/v1",
                    "circuit": {"failures": 3, "cooldown": 10},
                    "continuation_models": {"claude-*": "prompt"},
                }
            ],
            "routes": [
                {
                    "match": "*",
                    "upstream": "up",
                    "continuation": "vllm",
                    "timeouts": {"idle": 5},
                    "min_throughput": {"chars_per_s": 20},
                }
            ],
        },
        "test",
    )
    text = describe(config)
    assert "circuit(3 failures, 10s)" in text
    assert "continuation for claude-*: prompt" in text
    assert "up/<requested> (vllm)" in text
    assert "timeouts(idle=5s)" in text and "min_throughput(20 chars/s over 5s after 10s)" in text


def test_an_anthropic_upstream_serves_messages_continued_by_prefill_under_v1() -> None:
    config = parse_config(
        {
            "upstreams": [
                {"name": "claude", "kind": "anthropic", "base_url": "https://api.anthropic.com"},
                {"name": "compat", "kind": "anthropic", "base_url": "http://vllm:8000/v1/"},
                {"name": "openai", "base_url": "https://api.openai.com/v1"},
            ]
        }
    )
    claude, compat, openai = config.upstreams
    assert claude.protocols == ["messages"] and claude.continuation == "prefill"
    assert claude.api_root == "https://api.anthropic.com/v1"  # the SDK's base URL, plus /v1
    assert compat.api_root == "http://vllm:8000/v1"  # a /v1 already there is not doubled
    # Learned from the server (prefill on vLLM, SGLang, llama.cpp; else prompt).
    assert openai.protocols == ["chat", "responses"] and openai.continuation == "auto"
    assert openai.api_root == "https://api.openai.com/v1"
    assert "claude: https://api.anthropic.com (anthropic: messages)" in describe(config)


def test_an_anthropic_upstreams_defaults_give_way_to_what_is_configured() -> None:
    upstream = {"name": "c", "kind": "anthropic", "base_url": "http://x"}
    config = parse_config(
        {"upstreams": [upstream | {"continuation": "prompt", "protocols": ["messages", "chat"]}]}
    )
    assert config.upstreams[0].continuation == "prompt"
    assert config.upstreams[0].protocols == ["messages", "chat"]


def test_the_providers_page_config_is_valid() -> None:
    page = (Path(__file__).parent.parent / "docs" / "providers.md").read_text()
    block = page.split("```yaml\n", 1)[1].split("```", 1)[0]
    env = {
        "ANTHROPIC_API_KEY": "a",
        "OPENAI_API_KEY": "o",
        "AZURE_OPENAI_API_KEY": "z",
        "GEMINI_API_KEY": "g",
    }
    config = parse_config(interpolate_env(yaml.safe_load(block), env))
    kinds = {u.name: u.kind for u in config.upstreams}
    assert kinds == {
        "anthropic": "anthropic",
        "bedrock": "bedrock",
        "vertex": "vertex",
        "openai": "openai",
        "azure": "azure",
        "gemini": "gemini",
    }
    assert config.upstream("vertex").protocols == ["messages", "gemini"]
    bedrock = config.upstream("bedrock")
    assert bedrock.base_url == "https://bedrock-runtime.us-east-1.amazonaws.com"
    assert bedrock.protocols == ["messages"] and bedrock.continuation == "prefill"
    assert config.upstream("vertex").base_url == "https://us-east5-aiplatform.googleapis.com/v1"


@pytest.mark.parametrize(
    ("upstream", "problem"),
    [
        ({"kind": "bedrock"}, "kind bedrock needs a region"),
        ({"kind": "vertex", "region": "us-east5"}, "kind vertex needs a project"),
        ({"kind": "bedrock", "region": "r", "api_key": "k"}, "takes no api_key"),
        ({"kind": "azure", "base_url": "https://x.openai.azure.com"}, "api_version"),
        ({"kind": "bedrock", "region": "r", "protocols": ["chat"]}, "messages] only"),
        ({"kind": "bedrock", "region": "r", "aws_access_key_id": "A"}, "go together"),
        ({"kind": "openai", "base_url": "https://x", "aws_profile": "p"}, "for kind bedrock"),
        ({"kind": "vertex", "region": "r", "project": "p", "protocols": ["chat"]}, "gemini only"),
        ({"kind": "gemini", "protocols": ["chat"]}, "gemini] only"),
        ({"kind": "openai", "base_url": "https://x", "protocols": ["gemini"]}, "kinds gemini and"),
    ],
)
def test_cloud_kinds_say_what_they_need(upstream: dict[str, object], problem: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(problem)):
        parse_config({"upstreams": [{"name": "u"} | upstream]})


def test_a_gemini_upstream_needs_only_its_kind() -> None:
    config = parse_config(
        {
            "upstreams": [
                {"name": "g", "kind": "gemini"},
                {"name": "own", "kind": "gemini", "base_url": "https://gemini.internal"},
                {
                    "name": "v",
                    "kind": "vertex",
                    "region": "r",
                    "project": "p",
                    "protocols": ["gemini", "messages"],
                },
            ]
        }
    )
    default, own, vertex = config.upstreams
    assert default.api_root == "https://generativelanguage.googleapis.com/v1beta"
    assert default.protocols == ["gemini"] and default.continuation == "prefill"
    assert own.api_root == "https://gemini.internal/v1beta"  # the SDKs' version, when none
    assert vertex.protocols == ["gemini", "messages"]


def test_a_global_vertex_region_has_the_global_endpoint() -> None:
    config = parse_config(
        {"upstreams": [{"name": "v", "kind": "vertex", "region": "global", "project": "p"}]}
    )
    assert config.upstreams[0].base_url == "https://aiplatform.googleapis.com/v1"


def test_background_responses_are_on_for_openai_and_azure_and_off_elsewhere() -> None:
    def upstream(**fields: object) -> dict[str, object]:
        return {"upstreams": [{"name": "u"} | fields], "routes": [{"match": "*", "upstream": "u"}]}

    def runs(**fields: object) -> bool:
        return parse_config(upstream(**fields)).upstreams[0].runs_background

    assert runs(base_url="https://api.openai.com/v1")
    assert runs(kind="azure", base_url="https://x.openai.azure.com/openai/v1")
    assert not runs(base_url="http://127.0.0.1:8000/v1")  # vLLM, llama.cpp...: may not keep them
    assert runs(base_url="http://127.0.0.1:8000/v1", background=True)
    assert not runs(base_url="https://api.openai.com/v1", background=False)
    with pytest.raises(ConfigError, match="background is for kinds openai and azure"):
        parse_config(upstream(kind="anthropic", base_url="https://a", background=True))
