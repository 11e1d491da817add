"""`zoo-node devnet up|down|status`: a local chain (anvil) and IPFS daemon with the contracts deployed,
KEEPER minted to the dev accounts, a genesis library published and approved on chain, and the base models
the settings name (the node passes its bundled model's hash) approved by the DAO. A node in
devnet mode has its own account registered on the UsageLedger by the devnet's DAO (`register_node`).

State lives in DATA_DIR/devnet/: devnet.json (endpoints, addresses, accounts, the processes it
started), anvil.log, ipfs/ (the IPFS repository, kept across restarts) and devnet.lock (serialises
concurrent `up`/`down`). Every process the devnet starts is recorded the moment it is spawned, so
`down` stops exactly those, also when the `up` that started them was killed half-way.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from zoo.devnet.chain_state import dump_state, restore_clock
from zoo.devnet.info import DevnetInfo, warp
from zoo.devnet.process import ProcessRecord, pdeathsig
from zoo.registry.errors import ZooError
from zoo.registry.fsutil import write_atomic

TOKEN = 10**18
DEV_ACCOUNTS = 10
DEV_BALANCE = 1_000_000 * TOKEN  # KEEPER per dev account; sqrt gives each a weight of 10**12
GENESIS_VOTERS = (0, 1, 2)

Progress = Callable[[str], None]


class DevnetError(ZooError, RuntimeError):
    """The devnet cannot be brought up or reached; the message says why."""


@dataclass(frozen=True)
class DevnetSettings:
    """Governance parameters and ports of a devnet (defaults suit a person trying the DAO flow)."""

    voting_period_s: int = 300
    execution_delay_s: int = 0
    grace_period_s: int = 14 * 24 * 3600
    proposal_threshold: int = 1_000 * TOKEN
    quorum: int = 2 * 10**12  # quadratic weight: two full dev accounts
    voter_registry: str = "none"  # "allowlist": only the (checkpointed) allowlisted dev accounts vote
    chain_id: int = 31337
    epoch_s: int = 86_400  # the UsageLedger's epoch (credits.epoch_s)
    challenge_window_s: int = 300  # how long a usage report can be challenged before claims open
    anvil_port: int = 0
    ipfs_api_port: int = 0
    base_models: tuple[str, ...] = ()  # weights (64-hex SHA-256s) the genesis DAO approves as base models


class Devnet:
    """The devnet that belongs to one data directory."""

    def __init__(
        self, data_dir: Path, settings: DevnetSettings | None = None, cache_dir: Path | None = None
    ) -> None:
        self.dir = Path(data_dir) / "devnet"
        self.settings = settings or DevnetSettings()
        self.cache_dir = cache_dir  # compiled contracts go to cache_dir/contracts (default: build's own)

    @property
    def spawn_log(self) -> Path:
        """Every process `up` starts, one JSON line each, written the moment it is spawned: `down` can
        stop them even when devnet.json was never completed or is corrupt."""
        return self.dir / "spawned.jsonl"

    @property
    def state_file(self) -> Path:
        return self.dir / "devnet.json"

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self.dir.mkdir(parents=True, exist_ok=True)
        with open(self.dir / "devnet.lock", "w") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            yield

    def info(self) -> DevnetInfo | None:
        """The recorded devnet, whether or not it is still running."""
        try:
            return DevnetInfo.from_json(self.state_file.read_bytes())
        except FileNotFoundError:
            return None
        except (json.JSONDecodeError, TypeError, KeyError) as e:
            raise DevnetError(
                f"{self.state_file} is corrupt ({e}); run `zoo-node devnet down` to reset"
            ) from None

    def running(self) -> DevnetInfo | None:
        """The devnet if it is fully up: every recorded process alive and both endpoints answering."""
        from zoo.devnet.ipfs_daemon import api_answers

        info = self.info()
        if info is None or not info.ready or not all(p.alive() for p in info.processes):
            return None
        if not (_rpc_answers(info.rpc_url) and api_answers(info.ipfs_api)):
            return None
        return info

    def up(self, progress: Progress | None = None, die_with_parent: bool = False) -> tuple[DevnetInfo, bool]:
        """Start (or reuse) the devnet; returns its info and whether it was already running.

        die_with_parent ties the processes to the calling thread's life (for a node that owns its devnet).
        """
        say = progress or (lambda _msg: None)
        with self._locked():
            existing = self.running()
            if existing is not None:
                return existing, True
            self._stop_recorded()
            return self._start(say, die_with_parent), False

    def down(self) -> list[str]:
        """Stop exactly the processes this devnet started, even if devnet.json is corrupt; returns names.

        The chain (its saved state and deployment) and the IPFS repository stay: the next `up` resumes
        them. `reset` is what wipes them."""
        with self._locked():
            stopped = self._stop_recorded()
            with contextlib.suppress(DevnetError):
                info = self.info()
                if info is not None:
                    info.processes, info.ready = [], False
                    self._record(info)
                    return stopped
            self.state_file.unlink(missing_ok=True)  # corrupt: nothing in it can be resumed
            return stopped

    def reset(self) -> list[str]:
        """Stop the devnet and delete its chain, deployment record and IPFS repository: the next `up`
        deploys a new chain from scratch. Returns the names of the processes stopped."""
        with self._locked():
            stopped = self._stop_recorded()
            for path in (self.state_file, self.chain_state_file, self.dir / "anvil.log"):
                path.unlink(missing_ok=True)
            shutil.rmtree(self.dir / "ipfs", ignore_errors=True)
            return stopped

    def register_node(self, address: str, progress: Progress | None = None) -> bool:
        """Make `address` (a node's own account) a reporting node on this devnet's UsageLedger the way any
        node becomes one: a DAO call proposal of the ledger's `registerNode`, voted through by dev0-2 and
        executed (DevDao), never a shortcut past the governor. Returns False, proposing nothing, when it is
        registered already. DevnetError when the devnet is not running or the call did not register it."""
        from web3 import Web3

        from zoo.devnet.dev_dao import DevDao
        from zoo.registry.chain import LedgerClient

        say = progress or (lambda _msg: None)
        with self._locked():
            info = self.running()
            if info is None:
                raise DevnetError("the devnet is not running")
            if not info.ledger_address:
                raise DevnetError("the devnet has no UsageLedger")
            w3 = Web3(Web3.HTTPProvider(info.rpc_url, request_kwargs={"timeout": 30}))
            ledger = LedgerClient(w3, info.ledger_address)
            if ledger.is_registered(address):
                return False
            say(f"registering node {address} on the UsageLedger (a DAO call proposal)")
            DevDao(w3, info.registry_address, info.settings).call(
                info.ledger_address, ledger.governor_call("registerNode", address)
            )
            if not ledger.is_registered(address):
                raise DevnetError(f"the DAO's registerNode call was executed but {address} is not registered")
            return True

    @property
    def chain_state_file(self) -> Path:
        """The anvil state the chain resumes from (kept current by the chain-state keeper)."""
        return self.dir / "chain-state.json"

    def _stop_recorded(self) -> list[str]:
        records: dict[int, ProcessRecord] = {}
        try:
            for line in self.spawn_log.read_text().splitlines():
                with contextlib.suppress(ValueError, TypeError, KeyError):
                    rec = ProcessRecord(**json.loads(line))
                    records[rec.pid] = rec
        except FileNotFoundError:
            pass
        with contextlib.suppress(DevnetError):
            info = self.info()
            if info is not None:
                records.update({p.pid: p for p in info.processes})
        # The keeper first: on SIGTERM it writes a last dump, which needs anvil still up.
        ordered = sorted(records.values(), key=lambda p: p.name != "chain-state")
        stopped = [p.name for p in ordered if p.stop()]
        self.spawn_log.unlink(missing_ok=True)
        return stopped

    def _spawned(self, name: str, info: DevnetInfo) -> Callable[[int], None]:
        def record(pid: int) -> None:
            rec = ProcessRecord.of(name, pid)
            with open(self.spawn_log, "a") as f:
                f.write(json.dumps(rec.to_dict()) + "\n")
                f.flush()
                os.fsync(f.fileno())
            info.processes.append(rec)

        return record

    def _record(self, info: DevnetInfo) -> None:
        write_atomic(self.state_file, info.to_json())

    def _saved(self) -> DevnetInfo | None:
        """The deployment a previous `up` completed, when its chain state was saved too (else None)."""
        try:
            info = self.info()
        except DevnetError:
            return None
        if (
            info is None
            or not info.registry_address
            or not info.genesis
            or not self.chain_state_file.exists()
        ):
            return None
        return info

    def _start(self, say: Progress, die_with_parent: bool) -> DevnetInfo:
        from web3 import Web3

        from zoo.devnet.anvil import AnvilError, AnvilProcess
        from zoo.devnet.ipfs_daemon import IpfsDaemon
        from zoo.registry.keys import dev_account

        started = time.time()
        s = self.settings
        saved = self._saved()
        if saved is not None:
            info = saved
            info.processes, info.ready, info.started_at = [], False, started
        else:
            accounts = [{"name": f"dev{i}", "address": dev_account(i).address} for i in range(DEV_ACCOUNTS)]
            info = DevnetInfo(
                rpc_url="",
                chain_id=s.chain_id,
                token_address="",
                registry_address="",
                ipfs_api="",
                accounts=accounts,
                processes=[],
                settings=dict(s.__dict__),
                started_at=started,
            )
        try:
            say("resuming the saved chain" if saved else "starting anvil")
            load = ("--load-state", str(self.chain_state_file)) if saved else ()
            anvil = AnvilProcess(
                die_with_parent=die_with_parent, log_path=self.dir / "anvil.log", extra_args=load
            )
            try:
                anvil.start(
                    port=s.anvil_port,
                    chain_id=info.chain_id,
                    accounts=DEV_ACCOUNTS,
                    on_spawn=self._spawned("anvil", info),
                )
            except AnvilError as e:
                if not saved:
                    raise
                raise DevnetError(
                    f"the saved chain state {self.chain_state_file} cannot be loaded ({e}); "
                    "run `zoo-node devnet reset` to start a new devnet"
                ) from None
            info.rpc_url = anvil.rpc_url
            self._record(info)
            w3 = Web3(Web3.HTTPProvider(info.rpc_url, request_kwargs={"timeout": 30}))
            if saved:
                self._check_resumed(w3, info, say)

            say("starting IPFS")
            ipfs = IpfsDaemon(self.dir / "ipfs", s.ipfs_api_port, die_with_parent=die_with_parent)
            ipfs.start(on_spawn=self._spawned("ipfs", info))
            info.ipfs_api = ipfs.api_url
            self._record(info)

            if not saved:
                from zoo.contracts.build import build

                say("compiling contracts")
                artifacts = build(cache_dir=self.cache_dir / "contracts" if self.cache_dir else None)
                info.contracts_key = artifacts.key
                say("deploying KeeperToken and ExperienceRegistry")
                self._deploy(w3, info, artifacts)
                self._record(info)

                say("publishing and approving the genesis library")
                self._genesis(w3, info, artifacts)
                self._record(info)

            say("saving the chain state")
            dump_state(info.rpc_url, self.chain_state_file)
            self._start_keeper(info, anvil.pid, die_with_parent)
            info.ready = True
            self._record(info)
            return info
        except BaseException:
            # Leave nothing half-up: stop what was started, keep the state file for the post-mortem.
            for p in sorted(info.processes, key=lambda p: p.name != "chain-state"):
                p.stop()
            info.processes = []
            self._record(info)
            self.spawn_log.unlink(missing_ok=True)
            raise

    def _check_resumed(self, w3: Any, info: DevnetInfo, say: Progress) -> None:
        """The loaded chain must hold the recorded deployment, compiled from today's contract sources; its
        clock continues from its last block."""
        from zoo.contracts.build import build

        key = build(cache_dir=self.cache_dir / "contracts" if self.cache_dir else None).key
        if info.contracts_key != key:
            raise DevnetError(
                "the saved devnet was deployed from other contract sources than this version's; its "
                "contracts would not answer this client. Run `zoo-node devnet reset` to deploy them anew"
            )
        for name, address in (
            ("KeeperToken", info.token_address),
            ("ExperienceRegistry", info.registry_address),
            ("UsageLedger", info.ledger_address),
        ):
            if len(w3.eth.get_code(address)) == 0:
                raise DevnetError(
                    f"the saved chain state {self.chain_state_file} holds no {name} at {address}; "
                    "run `zoo-node devnet reset` to start a new devnet"
                )
        restore_clock(w3)
        wanted = dict(self.settings.__dict__)
        deployed_with = (
            "voting_period_s",
            "execution_delay_s",
            "grace_period_s",
            "quorum",
            "proposal_threshold",
            "epoch_s",
            "challenge_window_s",
        )
        changed = [k for k in (*deployed_with, "voter_registry") if info.settings.get(k) != wanted[k]]
        if changed:
            say(
                f"keeping the saved chain, deployed with other settings ({', '.join(changed)}); "
                "`zoo-node devnet reset` deploys a new one with the configured settings"
            )

    def _start_keeper(self, info: DevnetInfo, anvil_pid: int, die_with_parent: bool) -> None:
        """Start the process that keeps chain-state.json current (see zoo.devnet.chain_state)."""
        ready = self.dir / "chain-state.ready"
        ready.unlink(missing_ok=True)
        args = [sys.executable, "-m", "zoo.devnet.chain_state", "--rpc", info.rpc_url,
                "--out", str(self.chain_state_file), "--anvil-pid", str(anvil_pid),
                "--ready-file", str(ready)]  # fmt: skip
        with open(self.dir / "chain-state.log", "ab") as log:
            proc = subprocess.Popen(
                args,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=pdeathsig(signal.SIGTERM) if die_with_parent else None,
            )
        self._spawned("chain-state", info)(proc.pid)
        deadline = time.monotonic() + 30
        while not ready.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                log_tail = (self.dir / "chain-state.log").read_text(errors="replace")[-2000:]
                raise DevnetError(f"the chain-state keeper did not start (exit {proc.poll()}):\n{log_tail}")
            time.sleep(0.02)

    def _deploy(self, w3: Any, info: DevnetInfo, artifacts: Any) -> None:
        from zoo.registry.chain import deploy_allowlist, deploy_ledger, deploy_registry, deploy_token
        from zoo.registry.keys import dev_account

        s = self.settings
        deployer = dev_account(0)
        holders = [(a["address"], DEV_BALANCE) for a in info.accounts]
        info.token_address = deploy_token(w3, deployer, holders, artifacts=artifacts)
        if s.voter_registry == "allowlist":
            voters = [a["address"] for a in info.accounts]
            info.voter_registry_address = deploy_allowlist(w3, deployer, voters, artifacts=artifacts)
        elif s.voter_registry != "none":
            raise DevnetError(f"unknown voter registry {s.voter_registry!r} (none or allowlist)")
        info.registry_address = deploy_registry(
            w3,
            deployer,
            info.token_address,
            voting_period=s.voting_period_s,
            execution_delay=s.execution_delay_s,
            grace_period=s.grace_period_s,
            proposal_threshold=s.proposal_threshold,
            quorum=s.quorum,
            voter_registry=info.voter_registry_address or None,
            artifacts=artifacts,
        )
        info.ledger_address = deploy_ledger(
            w3,
            deployer,
            governor=info.registry_address,  # the DAO: nodes are registered by passed call proposals
            keeper_token=info.token_address,
            epoch_length=s.epoch_s,
            challenge_window=s.challenge_window_s,
            artifacts=artifacts,
        )
        info.deploy_block = int(w3.eth.block_number)

    def _genesis(self, w3: Any, info: DevnetInfo, artifacts: Any) -> None:
        from zoo.devnet.genesis import genesis_library
        from zoo.registry.canonical import encode_library
        from zoo.registry.chain import RegistryClient
        from zoo.registry.ipfs import IpfsClient
        from zoo.registry.keys import dev_account
        from zoo.registry.merkle import library_root

        library = genesis_library()
        root = library_root(library)
        with IpfsClient(info.ipfs_api) as ipfs:
            cid = ipfs.add(encode_library(library), pin=True)
        # Snapshots are taken strictly before the proposal, so the holders' votes must be at least a
        # second old: anvil stamps each automined block with the wall clock.
        warp(w3, 1)
        proposed = RegistryClient(w3, info.registry_address, dev_account(0), artifacts=artifacts).propose(
            root, cid, tree_size=len(library.experiences), parent_version=0
        )
        warp(w3, 1)
        for i in GENESIS_VOTERS:
            RegistryClient(w3, info.registry_address, dev_account(i), artifacts=artifacts).vote(
                proposed.proposal_id, True
            )
        s = self.settings
        warp(w3, s.voting_period_s + s.execution_delay_s + 1)
        result = RegistryClient(w3, info.registry_address, dev_account(0), artifacts=artifacts).execute(
            proposed.proposal_id
        )
        info.genesis = {"version": 1, "root": "0x" + root.hex(), "cid": cid, "block": result.block_number}
        # Base models the way any is approved: a call proposal of setBaseModel, voted through and executed.
        from zoo.devnet.dev_dao import DevDao

        registry = RegistryClient(w3, info.registry_address, dev_account(0), artifacts=artifacts)
        for model in s.base_models:
            DevDao(w3, info.registry_address, info.settings).call(
                info.registry_address, registry.base_model_call(model)
            )
        info.genesis["base_models"] = registry.base_models()


def _rpc_answers(url: str) -> bool:
    try:
        r = httpx.post(
            url, json={"jsonrpc": "2.0", "id": 1, "method": "eth_chainId", "params": []}, timeout=2
        )
        return r.status_code == 200 and "result" in r.json()
    except (httpx.HTTPError, ValueError):
        return False
