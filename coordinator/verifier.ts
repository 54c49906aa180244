// The executor's verifier: now and then it has another rank recompute a forward a strategy ran, and judges the
// group's rows (or, with pipeline stages, the hidden states each stage handed on) by it (spot-check.ts); where they
// disagree, the receipts of the group's exchanges may name the rank that sent a wrong tensor (exchange-evidence.ts).
// A rank convicted is thrown as a breach, so that the placer lets it go and the step runs again without it.
import { defined } from '../core/defined.ts';
import { hiddenStateFloats, type HiddenState } from '../core/model/blocks.ts';
import { patchify } from '../core/model/tokens.ts';
import type { UlyssesPlan } from '../core/parallel.ts';
import { concat } from '../core/tensor.ts';
import { MAX_MESSAGE_FLOATS, type RankLost, type RecomputeArgs } from '../core/worker-api.ts';
import { handOffDType, unprovenHandOff } from '../rank/hand-off.ts';
import { judgeExchanges, sameDigests, trueDigests } from './exchange-evidence.ts';
import type { StageRun } from './forward/staged.ts';
import { NO_PATCHES, rowWidthOf, type ForwardContext, type ForwardRequest } from './forward/strategy.ts';
import {
  checkedHiddenStates,
  checkedRows,
  judgeOutputs,
  pickChecker,
  spotCheckDraw,
  type CheckedOutputs,
  type SpotCheck,
} from './spot-check.ts';
import type { StepCacheForwards } from './step-cache-forwards.ts';
import { WorkerError } from './worker-errors.ts';

/**
 * A spot check found wrong rows (spot-check.ts). Convicted on the coordinator's own evidence (a
 * breach), or, `disputed`, a disagreement between the rank and `blame` (its checker) that no third
 * judgement decided: one of the two lied, and the record of accusations (accusations.ts) says which.
 */
export class SpotCheckFailed extends WorkerError {
  override name = 'SpotCheckFailed';
  constructor(
    rank: number,
    why: string,
    blame: RankLost | null,
    readonly disputed = false,
  ) {
    super(rank, 'spot check', why, blame, !disputed);
  }
}

/** What a failed spot check's receipts showed (Verifier.exchangeLie): the rank they convict, if any, and why. */
interface ExchangeFinding {
  rank: number | null;
  said: string;
}

/** The hidden states a stage's ranks were handed, as one of every token: x in token order, the rest as rank 0's. */
function wholeHiddenState(parts: HiddenState[]): HiddenState {
  return { ...parts[0], x: concat(parts.map((p) => p.x)) };
}

export class Verifier {
  private readonly spotCheckDue: (forward: { step: number; steps?: number }) => boolean;
  /** spot checks made and not yet taken (take) */
  private spotChecks: SpotCheck[] = [];

  constructor(
    private readonly context: ForwardContext,
    /** the forward a reuse reuses, which its check computes first */
    private readonly stepCache: Pick<StepCacheForwards, 'reusedForward'>,
    /** the key rank r signs what it sends its mesh with (Executor.initialize) */
    private readonly publicKeyOf: (rank: number) => string,
  ) {
    this.spotCheckDue = spotCheckDraw(context.placement.spotChecks.rate);
  }

  /** Whether this forward is drawn for a check (spot-check.ts: a secret draw per forward, more of the last steps). */
  due(forward: { step: number; steps?: number }): boolean {
    return this.spotCheckDue(forward);
  }

  /**
   * Checks a forward drawn for it, stage by stage where it went through stages: the first found wrong convicts. A
   * stage's input and output hand-offs are taken from their receivers' signed receipts (handedTo), once each; a stage
   * whose whole hidden state would not fit one message is not checked (the report shows it went unchecked).
   */
  async check(request: ForwardRequest, plan: UlyssesPlan, runs: StageRun[], stale: boolean): Promise<void> {
    const handOffs = new Map<number, Promise<HiddenState[]>>();
    const handedTo = (run: StageRun) => {
      let taken = handOffs.get(run.stage);
      if (!taken) handOffs.set(run.stage, (taken = this.handedTo(request, run)));
      return taken;
    };
    const { config, layout } = this.context;
    const whole = hiddenStateFloats(config.dim, plan.tokens, this.context.textRowsOf(request.pass));
    if (layout.stages > 1 && whole > MAX_MESSAGE_FLOATS) return;
    for (const [i, run] of runs.entries()) {
      const input = run.stage > 0 ? await handedTo(run) : null;
      const output = i + 1 < runs.length ? await handedTo(runs[i + 1]) : null;
      await this.spotCheck(request, plan, run, stale, input, output);
    }
  }

  /**
   * The hidden states a stage's ranks were handed for a forward, from their receipts, each proven the word of its
   * sender, the stage before's rank (rank/hand-off.ts unprovenHandOff): else the receiver lied in its evidence.
   */
  private async handedTo(request: ForwardRequest, run: StageRun): Promise<HiddenState[]> {
    const { layout, placement } = this.context;
    const forward = { job: request.job, step: request.step, pass: request.pass };
    const evidence = await this.context.collectiveRpc('handOffEvidence', { args: forward, ranks: run.ranks });
    const block = defined(placement.stages?.[run.stage], "the stage's blocks").blocks[0];
    const dtype = handOffDType(placement.settings.dtype);
    return evidence.map((e, i) => {
      const receiver = run.ranks[i];
      const sender = defined(layout.stagePartner(receiver, 'before'), 'the stage before');
      const why = unprovenHandOff(e, { tag: forward, block }, this.publicKeyOf(sender), dtype);
      if (why) throw new WorkerError(receiver, 'handOffEvidence', why, null, true);
      return e.hidden;
    });
  }

  /** The spot checks made since the last call: the report's. */
  take(): SpotCheck[] {
    return this.spotChecks.splice(0);
  }

  /**
   * Has another rank recompute the pass alone and judges the group's rows by it (spot-check.ts); with pipeline
   * stages, one stage's part of it, from the stage's input, by a rank holding the stage (of any CFG group), judged
   * by the hidden states the stage handed on or its rows. A rank convicted is thrown as a breach (with its co-accused
   * as blame), so the placer lets it go and the step runs again without it. A `stale` forward is recomputed as its
   * group ran it, by a rank of the group: only those hold the step before's keys and values.
   */
  private async spotCheck(
    request: ForwardRequest,
    plan: UlyssesPlan,
    run: StageRun,
    stale: boolean,
    /** the hidden states the stage's ranks were handed, where it is not the first */
    input: HiddenState[] | null,
    /** those its ranks handed on, where it is not the last */
    output: HiddenState[] | null,
  ): Promise<void> {
    const started = performance.now();
    const { config, layout } = this.context;
    const { ranks } = run;
    // a reuse's checker computes the forward it reuses first, for the residual (executeModel checks only exact ones)
    const kept = request.cache === 'reuse' && this.stepCache.reusedForward(request.pass);
    const args: RecomputeArgs = {
      job: request.job,
      step: request.step,
      pass: request.pass,
      timestep: request.timestep,
      latentShape: request.latent.shape,
      patches: input ? NO_PATCHES : patchify(config, request.latent).data,
      ...(input && { hidden: wholeHiddenState(input) }),
      ...(stale && { stale }),
      ...(kept && {
        cache: 'reuse',
        kept: { step: kept.step, timestep: kept.timestep, patches: patchify(config, kept.latent).data },
      }),
    };
    const holders = stale ? ranks : layout.stageHolders(run.stage);
    const others = Array.from({ length: this.context.world }, (_, r) => r).filter((r) => !holders.includes(r));
    const rowWidth = rowWidthOf(config);
    const {
      checker,
      third,
      judged: found,
    } = run.stage === layout.stages - 1
      ? await this.judgeRecomputed(
          args,
          ranks,
          others,
          checkedRows(
            plan,
            run.results.map((r) => r.rows),
            rowWidth,
          ),
        )
      : await this.judgeRecomputed(
          args,
          ranks,
          others,
          checkedHiddenStates(plan, defined(output, 'the hidden states the stage handed on'), {
            dim: config.dim,
            textRows: this.context.textRowsOf(request.pass),
            stage: run.stage,
          }),
        );
    let judged = found;
    // rows wrong from a tensor one rank sent the others are wrong on every rank: its receipts name who sent it
    let receipts: ExchangeFinding | undefined;
    if (judged.verdict !== 'agreed') {
      receipts = await this.exchangeLie(args, plan, ranks, checker, third).catch((e: unknown) => {
        // a rank whose receipts or recomputation broke the contract lied in them; anything else: the rows decide
        if (!(e instanceof WorkerError && e.breach)) return { rank: null, said: `not asked to the end: ${String(e)}` };
        return { rank: e.rank, said: `its evidence of the checked forward broke the contract: ${e.remoteMessage}` };
      });
      if (receipts.rank !== null) judged = { ...judged, verdict: { convicted: [receipts.rank], why: receipts.said } };
    }
    this.spotChecks.push({
      step: request.step,
      pass: request.pass,
      ...(layout.stages > 1 && { stage: run.stage }),
      checker,
      third,
      ...judged,
      ...(receipts && { receipts: receipts.said }),
      ms: performance.now() - started,
    });
    if (judged.verdict === 'agreed') return;
    // two convicted: no judgement said which of the two lied (a checker may lie about the rank it checks)
    const [convicted, alsoConvicted] = judged.verdict.convicted as [number, number?];
    const blame: RankLost | null =
      alsoConvicted === undefined
        ? null
        : {
            rank: alsoConvicted,
            cause: 'misbehaved',
            evidence: `a spot check of step ${request.step + 1}: ${judged.verdict.why}`,
          };
    throw new SpotCheckFailed(
      convicted,
      `step ${request.step + 1}${request.pass ? ' (unconditional)' : ''}: ${judged.verdict.why}`,
      blame,
      alsoConvicted !== undefined,
    );
  }

  /**
   * The group's `outputs` judged by a recomputation of a rank drawn from those not `out` and, where they disagree, a
   * third's (judgeOutputs); a recomputation that is not one of every token is a breach of its rank.
   */
  private async judgeRecomputed<T>(
    args: RecomputeArgs,
    ranks: number[],
    out: number[],
    outputs: CheckedOutputs<T>,
  ): Promise<{ checker: number; third: number | null; judged: Pick<SpotCheck, 'difference' | 'verdict'> }> {
    const recompute = async (rank: number) => {
      // judged as every call is: a checker whose engine moves is waited for, however slow
      const [reply] = await this.context.collectiveRpc('recompute', { args, ranks: [rank] });
      const taken = outputs.take(reply);
      if ('wrong' in taken) throw new WorkerError(rank, 'recompute', taken.wrong, null, true);
      return { rank, output: taken.output };
    };
    const checker = await recompute(defined(pickChecker(this.context.world, out), 'a rank to recompute'));
    const { tolerance } = this.context.placement.spotChecks;
    const judged = judgeOutputs(ranks, outputs, checker, null, tolerance);
    if (judged.verdict === 'agreed') return { checker: checker.rank, third: null, judged };
    // a rank independent of both the checker and the suspect decides
    const third = pickChecker(this.context.world, [checker.rank, judged.verdict.convicted[0], ...out]);
    if (third === null) return { checker: checker.rank, third, judged };
    return {
      checker: checker.rank,
      third,
      judged: judgeOutputs(ranks, outputs, checker, await recompute(third), tolerance),
    };
  }

  /**
   * The rank whose signed tensors made its Ulysses group's rows wrong, where the receipts of its exchanges name one
   * (exchange-evidence.ts) against a recomputation of them that two ranks make alike: the checker and the third
   * first, then ranks drawn from the CSPRNG. Only for an exact forward of a group of tabs on WASM, recomputed by
   * tabs on WASM: the receipts are digests, and only ranks that compute bit for bit alike send the same bytes.
   * WebGPU's kernels do not, nor a worker process's (native kernels, or Node's build of onnxruntime-web's WASM): an
   * honest process's tensors would differ from a tab's recomputation and name it.
   */
  private async exchangeLie(
    args: RecomputeArgs,
    plan: UlyssesPlan,
    ranks: number[],
    checker: number,
    third: number | null,
  ): Promise<ExchangeFinding> {
    const wasm = (rank: number) => {
      const worker = this.context.workers.at(rank);
      return worker?.ep === 'wasm' && (worker.kind ?? 'tab') === 'tab';
    };
    // displaced mode exchanges keys and values its recomputation does not: its receipts would prove nothing
    const not = (why: string) => ({ rank: null, said: `not asked: ${why}` });
    if (this.context.placement.settings.parallel !== 'ulysses') return not('displaced mode');
    if (this.context.layout.stages > 1) return not('pipeline stages');
    if (args.stale || args.cache) return not("a step cache's forward");
    if (!ranks.every(wasm)) return not('ranks not all tabs on WASM');
    const forward = { job: args.job, step: args.step, pass: args.pass };
    const evidence = await this.context.collectiveRpc('exchangeEvidence', { args: forward, ranks });
    const judges = [checker, ...(third === null ? [] : [third])];
    const { world } = this.context;
    for (let next = pickChecker(world, judges); next !== null; next = pickChecker(world, judges)) judges.push(next);
    const tables: Map<string, string>[] = [];
    let truth: Map<string, string> | undefined;
    for (const rank of judges.filter(wasm)) {
      const [{ received }] = await this.context.collectiveRpc('recomputeExchanges', {
        args: { ...args, heads: plan.heads, headGroups: plan.headGroups },
        ranks: [rank],
      });
      const table = trueDigests(received);
      truth = tables.find((t) => sameDigests(t, table));
      if (truth) break;
      tables.push(table);
    }
    if (!truth) return { rank: null, said: `no two of ${tables.length} recomputations of the exchanges agreed` };
    const publicKeys = ranks.map((r) => this.publicKeyOf(r));
    const verdict = judgeExchanges(
      forward,
      truth,
      evidence.map((e) => e.receipts),
      publicKeys,
    );
    if (!verdict) return { rank: null, said: 'every receipt was as recomputed: the rows decide' };
    const sender = verdict.senders.at(0);
    if (sender !== undefined)
      return {
        rank: ranks[sender],
        said:
          `it sent its peers ${verdict.where} other than its group's recomputed exchanges give, signed ` +
          '(their receipts prove it), and every rank computed its rows from them',
      };
    return { rank: ranks[verdict.forgers[0]], said: 'it kept a receipt of a tensor its sender never signed' };
  }
}
