"""The web app as the node serves it, over a real socket (a light node on a real devnet): its pages carry a
strict Content-Security-Policy, its assets nothing but themselves, no answer a secret; the chain relay lets
reads through and refuses everything else in JSON-RPC's words; library bytes come checked against their
CID; the operator status can be switched off, and the whole app too; contributors' drafts are validated and
built exactly as the CLI builds a library, and only bytes a proposal on chain names are published (or with
the admin token)."""

from __future__ import annotations

import json
import re

import httpx
import msgspec
import pytest
from web3 import Web3

from tests.node.approve import next_version
from tests.node.webapp.conftest import start_light_devnet_node
from zoo.devnet.genesis import genesis_library
from zoo.devnet.manager import Devnet
from zoo.node.webapp.site import CSP
from zoo.registry.canonical import decode_library, encode_library
from zoo.registry.chain import RegistryClient
from zoo.registry.experience import Experience
from zoo.registry.ipfs import local_cid
from zoo.registry.keys import dev_account, dev_address
from zoo.registry.merkle import library_root


def rpc(base: str, body: object) -> object:
    r = httpx.post(base + "/app/chain", content=json.dumps(body).encode(), timeout=30)
    assert r.status_code == 200 and r.headers["content-security-policy"] == CSP, r.text
    return r.json()


def test_pages_and_assets_carry_a_strict_policy_and_no_secret(light_node) -> None:
    base = str(light_node.info["http"])
    page = httpx.get(base + "/", timeout=30)
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert page.headers["content-security-policy"] == CSP and "script-src 'self'" in CSP
    assert "unsafe-inline" not in CSP and "connect-src 'self'" in CSP
    assert page.headers["x-content-type-options"] == "nosniff"
    scripts = re.findall(r"<script[^>]*>", page.text)
    assert scripts == ['<script type="module" src="/assets/app.js">']  # no inline script: the bundle alone
    script = httpx.get(base + "/assets/app.js", timeout=30)
    assert script.status_code == 200 and script.headers["content-type"].startswith("text/javascript")
    for bad in ("..%2Fsite.py", "app.py", "nothing.js", ".hidden.js"):
        r = httpx.get(base + "/assets/" + bad, timeout=30)
        assert r.status_code == 404, (bad, r.status_code)
    config = httpx.get(base + "/app/config.json", timeout=30).json()
    info = Devnet(light_node.data_dir).info()
    assert config["registry"] == info.registry_address and config["chain"] and config["status"]
    assert {"ExperienceRegistry", "KeeperToken", "UsageLedger"} <= set(config["abi"])
    secret = light_node.admin_token
    status = httpx.get(base + "/app/status.json", timeout=30).json()
    assert int(status["library"]["version"]) >= 1 and "data_dir" not in status  # no path of the operator's
    for answer in (page.text, script.text, json.dumps(config), httpx.get(base + "/app/status.json").text):
        assert secret not in answer


def test_the_chain_relay_passes_reads_and_refuses_the_rest(light_node) -> None:
    base = str(light_node.info["http"])
    chain_id = rpc(base, {"jsonrpc": "2.0", "id": 1, "method": "eth_chainId", "params": []})
    assert chain_id == {"jsonrpc": "2.0", "id": 1, "result": "0x7a69"}
    sent = rpc(base, {"jsonrpc": "2.0", "id": 2, "method": "eth_sendTransaction", "params": [{}]})
    assert sent["id"] == 2 and sent["error"]["code"] == -32601 and "wallet" in sent["error"]["message"]
    cheat = rpc(base, {"jsonrpc": "2.0", "id": 3, "method": "anvil_setBalance", "params": []})
    assert cheat["error"]["code"] == -32601
    # Reads of the node's own contracts only: the registry, its token, the ledger.
    info = Devnet(light_node.data_dir).info()
    call = {"jsonrpc": "2.0", "id": 4, "method": "eth_call", "params": [{"data": "0x06fdde03"}, "latest"]}
    call["params"][0]["to"] = info.token_address
    assert "result" in rpc(base, call), rpc(base, call)  # the token's name()
    call["params"][0]["to"] = "0x" + "12" * 20
    assert "contracts" in rpc(base, call)["error"]["message"]
    logs = {"jsonrpc": "2.0", "id": 5, "method": "eth_getLogs", "params": [{"fromBlock": "0x0"}]}
    assert rpc(base, logs)["error"]["code"] == -32600  # no address: every contract's logs
    logs["params"][0]["address"] = info.registry_address
    assert isinstance(rpc(base, logs)["result"], list)
    batch = rpc(base, [
        {"jsonrpc": "2.0", "id": "a", "method": "eth_blockNumber", "params": []},
        {"jsonrpc": "2.0", "id": "b", "method": "evm_mine", "params": []},
        {"jsonrpc": "1.0", "id": "c", "method": "eth_chainId"},
    ])  # fmt: skip
    assert isinstance(batch, list) and [a["id"] for a in batch] == ["a", "b", "c"]
    assert batch[0]["result"].startswith("0x") and batch[1]["error"]["code"] == -32601
    assert batch[2]["error"]["code"] == -32600
    r = httpx.post(base + "/app/chain", content=b"{not json", timeout=30)
    assert r.json()["error"]["code"] == -32700
    too_many = [{"jsonrpc": "2.0", "id": i, "method": "eth_chainId", "params": []} for i in range(65)]
    assert rpc(base, too_many)["error"]["code"] == -32600
    assert rpc(base, [])["error"]["code"] == -32600
    assert rpc(base, {"jsonrpc": "2.0", "id": [1], "method": "eth_chainId"})["error"]["code"] == -32600


def test_library_bytes_come_checked_and_bad_cids_are_refused(light_node) -> None:
    base = str(light_node.info["http"])
    cid = Devnet(light_node.data_dir).info().genesis["cid"]
    r = httpx.get(base + f"/app/ipfs/{cid}", timeout=60)
    assert r.status_code == 200 and json.loads(r.content)["schema"].startswith("zoo.experience-library/")
    assert httpx.get(base + "/app/ipfs/not-a-cid!", timeout=30).status_code == 400
    # Content no proposal names is not relayed (the node is no open IPFS gateway).
    r = httpx.get(base + f"/app/ipfs/{local_cid(b'anything at all')}", timeout=60)
    assert r.status_code == 404 and "no library proposal" in r.text


def test_status_and_the_app_can_be_switched_off(tmp_path) -> None:
    node = start_light_devnet_node(tmp_path / "quiet", http={"app_status": False})
    try:
        base = str(node.info["http"])
        r = httpx.get(base + "/app/status.json", timeout=30)
        assert r.status_code == 404 and "app_status" in r.text
        assert httpx.get(base + "/app/config.json", timeout=30).json()["status"] is False
    finally:
        node.stop()
    node = start_light_devnet_node(tmp_path / "off", http={"app": False})
    try:
        base = str(node.info["http"])
        assert httpx.get(base + "/", timeout=30).status_code == 404
        assert httpx.get(base + "/app/config.json", timeout=30).status_code == 404
        assert httpx.get(base + "/v1/models", timeout=30).status_code == 200  # the API itself stays
    finally:
        node.stop()


@pytest.mark.parametrize("body", [b"", b"[]", b"null", b'"x"', b"1" * 300_000])
def test_the_relay_answers_any_body_in_json_rpc(light_node, body: bytes) -> None:
    r = httpx.post(str(light_node.info["http"]) + "/app/chain", content=body, timeout=30)
    assert r.status_code == 200 and "error" in r.json(), r.text


def post(base: str, path: str, body: object, **kwargs: object) -> httpx.Response:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    r = httpx.post(base + path, content=data, timeout=60, **kwargs)
    assert r.headers["content-security-policy"] == CSP
    return r


def test_drafts_are_validated_and_built_as_the_cli_builds_them(light_node) -> None:
    base = str(light_node.info["http"])
    lesson = {
        "text": "When a draft is built, its root covers every experience.",
        "domain": "web.drafts",
        "confidence": 0.7,
        "author": dev_address(2),
        "base_model": "HuggingFaceTB/SmolLM2-135M-Instruct",
    }
    r = post(base, "/app/draft/experience", lesson)
    assert r.status_code == 200, r.text
    doc = r.json()
    made = Experience.create(**{**lesson, "created_at": doc["provenance"]["created_at"]})
    assert doc == json.loads(msgspec.json.encode(made)) and doc["id"].startswith("exp-")
    refused = post(base, "/app/draft/experience", {**lesson, "text": "A rule without its trigger."})
    assert refused.status_code == 400 and refused.json()["error"]["field"] == "text"
    assert (
        post(base, "/app/draft/experience", {**lesson, "colour": "red"}).json()["error"]["field"] == "colour"
    )
    assert post(base, "/app/draft/experience", b"{nope").status_code == 400
    assert (
        post(base, "/app/draft/experience", {**lesson, "examples": 5}).json()["error"]["field"] == "examples"
    )
    too_big = post(base, "/app/draft/experience", b" " * (300 * 1024))
    assert too_big.status_code == 413

    genesis = genesis_library()
    root = "0x" + library_root(genesis).hex()
    documents = [json.loads(msgspec.json.encode(e)) for e in genesis.experiences] + [doc]
    draft = {"version": 2, "parent_root": root, "base_model": genesis.base_model, "experiences": documents}
    r = post(base, "/app/draft/build", draft)
    assert r.status_code == 200, r.text
    built = r.json()
    expected = decode_library(built["document"].encode())
    assert (
        built["root"] == "0x" + library_root(expected).hex() and built["size"] == len(genesis.experiences) + 1
    )
    assert built["cid"] == local_cid(built["document"].encode())
    forged = {**doc, "text": "When the text changes, the id must change too."}
    r = post(base, "/app/draft/build", {**draft, "experiences": [forged]})
    assert r.status_code == 400 and "experiences[0]" in r.json()["error"]["message"], r.text
    assert post(base, "/app/draft/build", {**draft, "version": "2"}).status_code == 400
    assert post(base, "/app/draft/build", [1, 2]).status_code == 400


def test_only_what_a_proposal_names_is_published_without_the_admin_token(light_node) -> None:
    base = str(light_node.info["http"])
    genesis = genesis_library()
    lesson = ("web.publish", "When nobody proposed a library, the node does not pin it.")
    library = next_version(genesis, "0x" + library_root(genesis).hex(), lesson)
    data = encode_library(library)
    cid = local_cid(data)
    r = post(base, "/app/publish", data)
    assert r.status_code == 403 and cid in r.json()["error"]["message"]
    assert httpx.get(base + f"/app/ipfs/{cid}", timeout=60).status_code != 200  # nothing was pinned
    assert (
        post(base, "/app/publish", data + b" ").status_code == 403
    )  # other bytes: another CID, named by none
    wrong = post(base, "/app/publish", data, headers={"authorization": "Bearer wrong"})
    assert wrong.status_code == 403
    # Proposed on chain, the same bytes are published for anyone.
    info = Devnet(light_node.data_dir).info()
    w3 = Web3(Web3.HTTPProvider(info.rpc_url, request_kwargs={"timeout": 60}))
    RegistryClient(w3, info.registry_address, dev_account(3)).propose(
        library_root(library), cid, tree_size=len(library.experiences)
    )
    r = post(base, "/app/publish", data)
    assert r.status_code == 200 and r.json()["cid"] == cid, r.text
    assert httpx.get(base + f"/app/ipfs/{cid}", timeout=60).content == data
    lesson = ("web.publish", "When an operator publishes, the token is enough.")
    other = encode_library(next_version(library, "0x" + library_root(library).hex(), lesson))
    token = {"authorization": f"Bearer {light_node.admin_token}"}
    admin = post(base, "/app/publish", other, headers=token)
    assert admin.status_code == 200 and admin.json()["cid"] == local_cid(other)
    refused = post(base, "/app/publish", other + b" ", headers=token)
    assert refused.status_code == 400 and "canonical" in refused.json()["error"]["message"]


def test_a_light_node_measures_no_effects(light_node) -> None:
    base = str(light_node.info["http"])
    assert httpx.get(base + "/app/config.json", timeout=30).json()["tasks"] == []
    r = post(base, "/app/effect", {"proposal": "0x" + "00" * 32, "task": "families/habitats-test"})
    assert r.status_code == 404 and "serves no model" in r.json()["error"]["message"]


def test_jobs_need_the_admin_token(light_node) -> None:
    base = str(light_node.info["http"])
    wrong = [{}, {"authorization": "Bearer not-the-token"}, {"authorization": light_node.admin_token},
             {"authorization": "Bearer t\u00f6ken".encode("latin-1")}]  # fmt: skip
    for headers in wrong:
        r = httpx.get(base + "/app/jobs.json", headers=headers, timeout=30)
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer", (headers, r.text)
        assert post(base, "/app/jobs/job-000000000000/cancel", b"", headers=headers).status_code == 401
    admin = {"authorization": f"Bearer {light_node.admin_token}"}
    r = httpx.get(base + "/app/jobs.json", headers=admin, timeout=30)
    assert r.status_code == 200 and r.json() == {"jobs": []}  # a light node runs none
    assert post(base, "/app/jobs/job-000000000000/cancel", b"", headers=admin).status_code == 404
    assert post(base, "/app/jobs/nonsense/cancel", b"", headers=admin).status_code == 400
