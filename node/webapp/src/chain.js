// The chain, through viem: reads go to the node's read-only relay (/app/chain, same origin), transactions
// to the user's wallet (EIP-1193, window.ethereum), which signs and sends them. The page never sees a key.
// ABIs are the contracts' own solc output, served by the node (/app/config.json): no hand-written encoding.

import { createPublicClient, createWalletClient, custom, decodeFunctionData, http, numberToHex } from "viem";

// A proposal id as the CLI and the chain's tools write it: 0x and 64 hex digits.
export function proposalId(id) {
  return numberToHex(id, { size: 32 });
}

export const STATES = ["Unknown", "Pending", "Active", "Defeated", "Queued", "Succeeded", "Executed", "Stale", "Expired", "Canceled"];

export class Chain {
  constructor(config) {
    this.config = config;
    this.abi = config.abi;
    this.registry = config.registry;
    this.ledger = config.ledger;
    this.client = createPublicClient({
      transport: http(new URL("/app/chain", window.location.href).href, { batch: { batchSize: 32 } }),
      pollingInterval: 500,
    });
    this.account = null;
    this.wallet = null;
  }

  read(functionName, args = [], address = this.registry, abi = this.abi.ExperienceRegistry) {
    return this.client.readContract({ address, abi, functionName, args });
  }

  async token() {
    this._token ??= await this.read("token");
    return this._token;
  }

  readToken(functionName, args = []) {
    return this.token().then((address) => this.read(functionName, args, address, this.abi.KeeperToken));
  }

  async now() {
    const block = await this.client.getBlock();
    return Number(block.timestamp);
  }

  async parameters() {
    if (!this._parameters) {
      const names = ["quorum", "votingPeriod", "executionDelay", "gracePeriod", "proposalThreshold", "currentVersion"];
      const values = await Promise.all(names.map((n) => this.read(n)));
      this._parameters = Object.fromEntries(names.map((n, i) => [n, values[i]]));
    }
    return this._parameters;
  }

  // Every proposal, newest first: library proposals (ProposalCreated) and call proposals (CallProposed).
  async proposals() {
    const abi = this.abi.ExperienceRegistry;
    const [libraries, calls] = await Promise.all(
      ["ProposalCreated", "CallProposed"].map((eventName) =>
        this.client.getContractEvents({ address: this.registry, abi, eventName, fromBlock: BigInt(this.config.from_block ?? 0) }),
      ),
    );
    const all = [
      ...libraries.map((log) => ({ kind: "library", ...log.args, id: log.args.proposalId, block: log.blockNumber })),
      ...calls.map((log) => ({ kind: "call", ...log.args, id: log.args.proposalId, block: log.blockNumber })),
    ];
    all.sort((a, b) => Number(b.voteStart - a.voteStart));
    await Promise.all(all.map(async (p) => Object.assign(p, await this.tally(p.id))));
    return all;
  }

  async tally(id) {
    const [state, proposal] = await Promise.all([this.read("state", [id]), this.read("proposal", [id])]);
    return { state: STATES[state] ?? `state ${state}`, ...proposal };
  }

  async proposal(id) {
    const tally = await this.tally(id);
    if (tally.state === "Unknown") return null;
    const found = { id, ...tally, kind: tally.treeSize > 0n ? "library" : "call" };
    if (found.kind === "call") {
      const [target, data] = await this.read("proposedCall", [id]);
      Object.assign(found, { target, data, call: this.describeCall(target, data) });
    }
    return found;
  }

  // A call proposal in words: the function and its arguments, decoded with the target's ABI.
  describeCall(target, data) {
    const abi =
      target.toLowerCase() === this.registry.toLowerCase()
        ? this.abi.ExperienceRegistry
        : this.ledger && target.toLowerCase() === this.ledger.toLowerCase()
          ? this.abi.UsageLedger
          : null;
    const where = abi === this.abi.ExperienceRegistry ? "the registry" : abi ? "the UsageLedger" : target;
    if (!abi) return { where, text: `a call to ${target} (not a contract this node knows)` };
    try {
      const { functionName, args } = decodeFunctionData({ abi, data });
      const shown = (args ?? []).map((a) => (typeof a === "bigint" ? `0x${a.toString(16)}` : String(a)));
      return { where, functionName, args: shown, text: `${functionName}(${shown.join(", ")})` };
    } catch (e) {
      return { where, text: `calldata ${data.slice(0, 10)}… that ${where}'s ABI does not decode` };
    }
  }

  async version(number) {
    const [root, treeSize, cid, timestamp] = await this.read("versionAt", [number]);
    return { number, root, treeSize, cid, timestamp };
  }

  async votingWeight(id, voter) {
    return this.read("votingWeight", [id, voter]);
  }

  // -- the wallet -------------------------------------------------------------------------------------

  hasWallet() {
    return typeof window.ethereum?.request === "function";
  }

  // Asks the wallet for an account (it may ask its user); `quietly`: only an account it already allowed
  // this page (eth_accounts, no prompt), as after a reload.
  async connect({ quietly = false } = {}) {
    if (!this.hasWallet()) throw new Error("no wallet in this browser (an EIP-1193 provider such as MetaMask)");
    this.wallet = createWalletClient({ transport: custom(window.ethereum) });
    const [account] = quietly ? await this.wallet.getAddresses() : await this.wallet.requestAddresses();
    if (!account && !quietly) throw new Error("the wallet gave no account");
    this.account = account ?? null;
    return this.account;
  }

  async holder() {
    const a = this.account;
    const [balance, votes, delegate, decimals] = await Promise.all([
      this.readToken("balanceOf", [a]),
      this.readToken("getVotes", [a]),
      this.readToken("delegates", [a]),
      this.readToken("decimals"),
    ]);
    return { balance, votes, delegate, decimals, power: sqrt(votes) };
  }

  // A transaction the wallet signs and sends; resolves once it is mined (its receipt), rejects on revert.
  async send(functionName, args, { address = this.registry, abi = this.abi.ExperienceRegistry } = {}) {
    if (!this.account) throw new Error("connect a wallet first");
    await this.sameChain();
    // The gas, estimated here with a quarter more: a wallet that sends exactly its own estimate (anvil's
    // does) runs out when the block it lands in differs a little (a proposal's state a second later).
    const estimate = await this.client.estimateContractGas({ account: this.account, address, abi, functionName, args });
    const gas = estimate + estimate / 4n + 10_000n;
    const hash = await this.wallet.writeContract({ account: this.account, address, abi, functionName, args, gas, chain: null });
    const receipt = await this.client.waitForTransactionReceipt({ hash, pollingInterval: 300, timeout: 180_000 });
    if (receipt.status !== "success") throw new Error(`${functionName} reverted (transaction ${hash})`);
    return receipt;
  }

  // The wallet must send to the chain this node follows: asked to switch if it is on another, refused else.
  async sameChain() {
    const [ours, theirs] = await Promise.all([this.client.getChainId(), this.wallet.getChainId()]);
    if (ours === theirs) return;
    try {
      await this.wallet.switchChain({ id: ours });
    } catch {
      throw new Error(`the wallet is on chain ${theirs}; this node follows chain ${ours}: switch the wallet's network`);
    }
    if ((await this.wallet.getChainId()) !== ours) throw new Error(`the wallet did not switch to chain ${ours}`);
  }

  async delegateTo(address) {
    return this.send("delegate", [address], { address: await this.token(), abi: this.abi.KeeperToken });
  }
}

// The contract's own rounding (OpenZeppelin Math.sqrt rounds down).
export function sqrt(value) {
  if (value < 2n) return value;
  let x = value;
  let y = (x + 1n) / 2n;
  while (y < x) {
    x = y;
    y = (x + value / x) / 2n;
  }
  return x;
}
