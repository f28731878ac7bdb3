// Which output each answer goes to, and what the output items hold.
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { describe, it } from 'node:test';
import {
	ACCEPTED_ANSWER,
	ANSWER_FIELD,
	MINIMAL_PARAMS,
	NodeOperationError,
	ok,
	outputsFor,
	paramsFor,
	run,
	runError,
} from './context.mjs';

/**
 * The decisions and reasons the sidecar answers per operation, written from its
 * /openapi.json and enums by `python tests/node_contract.py` (and checked to be
 * current by tests/project/test_node_contract.py).
 */
const CONTRACT = JSON.parse(readFileSync(new URL('./contract.json', import.meta.url), 'utf8'));

/** Each branching operation: [answer, output index, output name]. */
const ROUTES = {
	'activation.checkTrigger': [
		[{ decision: 'proceed', reason: 'new_chain', chain_id: 'c1' }, 0, 'Proceed'],
		[{ decision: 'drop', reason: 'echo' }, 1, 'Drop'],
	],
	'operation.begin': [
		[{ decision: 'execute', reason: 'new', operation: { attempt: 1 } }, 0, 'Execute'],
		[{ decision: 'replay', reason: 'committed', operation: { receipt: { id: 1 } } }, 1, 'Replay'],
		[{ decision: 'in_progress', reason: 'lease_held' }, 2, 'Wait'],
		[{ decision: 'reconcile', reason: 'outcome_unknown' }, 3, 'Reconcile'],
		[{ decision: 'conflict', reason: 'payload_mismatch' }, 4, 'Refused'],
		[{ decision: 'stopped', reason: 'workflow_stopped' }, 4, 'Refused'],
		[{ decision: 'exhausted', reason: 'max_attempts' }, 4, 'Refused'],
	],
	'task.admitToolCall': [
		[{ decision: 'execute', call_id: 'k1' }, 0, 'Execute'],
		[{ decision: 'replay', receipt: { id: 'r' } }, 1, 'Replay'],
		[{ decision: 'deny', reason: 'same_call', message: 'Stop repeating.' }, 2, 'Deny'],
	],
	'task.complete': [
		[{ decision: 'completed', reason: 'verified_done' }, 0, 'Done'],
		[{ decision: 'continue', reason: 'check_failed' }, 1, 'Continue'],
		[{ decision: 'ended', reason: 'model_budget' }, 2, 'Ended'],
	],
	'check.run': [
		[{ passed: true, reason: 'passed', revision: 3, evidence: {} }, 0, 'Pass'],
		[{ passed: false, reason: 'unexpected_status', revision: null, evidence: {} }, 1, 'Fail'],
	],
};

/** The output that receives errors under Continue On Fail (never one that acts). */
const ERROR_OUTPUT = {
	'activation.checkTrigger': [1, 'Drop'],
	'operation.begin': [4, 'Refused'],
	'task.admitToolCall': [2, 'Deny'],
	'task.complete': [1, 'Continue'],
	'check.run': [1, 'Fail'],
};

/** An answer with a decision this node does not know, per branching operation. */
const UNKNOWN = {
	'activation.checkTrigger': { decision: 'maybe' },
	'operation.begin': { decision: 'maybe' },
	'task.admitToolCall': { decision: 'allow' },
	'task.complete': { decision: 'done' },
	'check.run': { passed: 'true' },
};

const SINGLE = Object.keys(MINIMAL_PARAMS).filter((key) => !(key in ROUTES));

function sizes(out) {
	return out.map((o) => o.length);
}

describe('branching operations route every decision', () => {
	for (const [key, routes] of Object.entries(ROUTES)) {
		const names = outputsFor(paramsFor(key)).map((o) => o.displayName);
		for (const [answer, index, name] of routes) {
			it(`${key}: ${JSON.stringify(answer.decision ?? answer.passed)} → ${name} (${index})`, async () => {
				assert.equal(names[index], name, 'the output index carries the expected name');
				const input = { json: { order: 17, nested: { a: 1 } } };
				const { out } = await run({
					params: paramsFor(key),
					items: [input],
					answers: [ok(answer)],
				});
				assert.equal(out.length, names.length, 'one array per declared output');
				const expected = names.map((_, i) => (i === index ? 1 : 0));
				assert.deepEqual(sizes(out), expected);
				const [item] = out[index];
				assert.deepEqual(item.json, { order: 17, nested: { a: 1 }, [ANSWER_FIELD]: answer });
				assert.deepEqual(item.pairedItem, { item: 0 });
				assert.equal(item.error, undefined);
				assert.deepEqual(
					input.json,
					{ order: 17, nested: { a: 1 } },
					'the input item is not changed',
				);
			});
		}
	}
});

describe('the fixtures speak the sidecar contract', () => {
	it('every branching operation has a contract entry', () => {
		assert.deepEqual(Object.keys(ROUTES).sort(), Object.keys(CONTRACT).sort());
	});
	for (const [key, routes] of Object.entries(ROUTES)) {
		const contract = CONTRACT[key];
		it(`${key}: every fixture's decision and reason is one the sidecar sends`, () => {
			for (const [answer] of routes) {
				if ('decision' in answer)
					assert.ok(contract.decisions.includes(answer.decision), answer.decision);
				else assert.ok(contract.passed.includes(answer.passed), String(answer.passed));
				if (answer.reason != null)
					assert.ok(contract.reasons.includes(answer.reason), answer.reason);
			}
		});
		it(`${key}: every decision the sidecar sends lands on a named output`, async () => {
			const names = outputsFor(paramsFor(key)).map((o) => o.displayName);
			const values = contract.decisions ?? contract.passed;
			const field = contract.decisions ? 'decision' : 'passed';
			const routed = new Set(routes.map(([answer]) => answer[field]));
			assert.deepEqual([...routed].sort(), [...values].sort(), 'a fixture for every decision');
			for (const value of values) {
				const { out } = await run({ params: paramsFor(key), answers: [ok({ [field]: value })] });
				const landed = out.findIndex((o) => o.length === 1);
				assert.ok(landed >= 0 && names[landed], `${field} ${value} lands on an output`);
			}
		});
	}
});

describe('several items route independently', () => {
	it('operation.begin: each item lands where its own answer says', async () => {
		const decisions = ['replay', 'execute', 'conflict', 'in_progress', 'execute', 'reconcile'];
		const items = decisions.map((_, i) => ({ json: { n: i } }));
		const { ctx, out } = await run({
			params: paramsFor('operation.begin', { operationId: (i) => `op-${i}` }),
			items,
			answers: decisions.map((decision) => ok({ decision })),
		});
		assert.deepEqual(
			ctx.calls.map((c) => c.options.url.split('/').at(-2)),
			['op-0', 'op-1', 'op-2', 'op-3', 'op-4', 'op-5'],
		);
		const where = out.map((o) => o.map((item) => [item.json.n, item.pairedItem.item]));
		assert.deepEqual(where, [
			[
				[1, 1],
				[4, 4],
			],
			[[0, 0]],
			[[3, 3]],
			[[5, 5]],
			[[2, 2]],
		]);
		for (const o of out) {
			for (const item of o) assert.equal(item.json.loopstop.decision, decisions[item.json.n]);
		}
	});

	it('activation.checkTrigger: proceed and drop in one run', async () => {
		const { out } = await run({
			params: paramsFor('activation.checkTrigger'),
			items: [{ json: { id: 'a' } }, { json: { id: 'b' } }, { json: { id: 'c' } }],
			answers: [ok({ decision: 'drop' }), ok({ decision: 'proceed' }), ok({ decision: 'drop' })],
		});
		assert.deepEqual(
			out.map((o) => o.map((item) => item.json.id)),
			[['b'], ['a', 'c']],
		);
		assert.deepEqual(
			out.map((o) => o.map((item) => item.pairedItem)),
			[[{ item: 1 }], [{ item: 0 }, { item: 2 }]],
		);
	});

	it('check.run: pass and fail in one run', async () => {
		const { out } = await run({
			params: paramsFor('check.run'),
			items: [{ json: { t: 1 } }, { json: { t: 2 } }],
			answers: [ok({ passed: false }), ok({ passed: true })],
		});
		assert.deepEqual(
			out.map((o) => o.map((item) => item.json.t)),
			[[2], [1]],
		);
	});
});

describe('single-output operations', () => {
	for (const key of SINGLE) {
		it(`${key}: one output, every item with its answer`, async () => {
			const answers = [ok({ n: 0, decision: 'whatever' }), ok({ n: 1 })];
			const { out } = await run({
				params: paramsFor(key),
				items: [{ json: { i: 0 } }, { json: { i: 1 } }],
				answers,
			});
			assert.deepEqual(outputsFor(paramsFor(key)), ['main']);
			assert.equal(out.length, 1);
			assert.deepEqual(out[0], [
				{ json: { i: 0, loopstop: { n: 0, decision: 'whatever' } }, pairedItem: { item: 0 } },
				{ json: { i: 1, loopstop: { n: 1 } }, pairedItem: { item: 1 } },
			]);
		});
	}

	it('a 2xx answer that is not a JSON object is an error', async () => {
		for (const body of [[], 'ok', null]) {
			const { error } = await runError({
				params: paramsFor('operation.commit'),
				answers: [{ statusCode: 200, body }],
			});
			assert.match(error.message, /answered 200/);
		}
	});

	it('a 201 answer is accepted (task.create of a new task)', async () => {
		const { out } = await run({
			params: paramsFor('task.create'),
			answers: [{ statusCode: 201, body: { task: { task_id: 't1' } } }],
		});
		assert.deepEqual(out[0][0].json.loopstop, { task: { task_id: 't1' } });
	});
});

describe('an unknown decision is an error, never a branch that acts', () => {
	for (const [key, answer] of Object.entries(UNKNOWN)) {
		it(`${key}: ${JSON.stringify(answer)} throws with the item index`, async () => {
			const [accepted] = ROUTES[key][0];
			const { ctx, error } = await runError({
				params: paramsFor(key),
				items: [{ json: { i: 0 } }, { json: { i: 1 } }],
				answers: [ok(accepted), ok(answer)],
			});
			assert.ok(error instanceof NodeOperationError, error.constructor.name);
			assert.match(error.message, /decision this node does not know/);
			assert.ok(error.message.includes(JSON.stringify(answer.decision ?? answer.passed)));
			assert.equal(error.context.itemIndex, 1);
			assert.equal(ctx.calls.length, 2);
		});

		it(`${key}: under Continue On Fail it goes to ${ERROR_OUTPUT[key][1]} with json.error`, async () => {
			const [index, name] = ERROR_OUTPUT[key];
			const names = outputsFor(paramsFor(key)).map((o) => o.displayName);
			assert.equal(names[index], name);
			const [accepted, acceptedIndex] = ROUTES[key][0];
			const { out } = await run({
				params: paramsFor(key),
				items: [{ json: { i: 0 } }, { json: { i: 1 } }, { json: { i: 2 } }],
				answers: [ok(answer), ok(accepted), ok(answer)],
				continueOnFail: true,
			});
			assert.equal(acceptedIndex, 0);
			assert.deepEqual(
				out[0].map((item) => item.json.i),
				[1],
				'only the known decision reaches the acting output',
			);
			const failed = out[index];
			assert.deepEqual(
				failed.map((item) => [item.json.i, item.pairedItem]),
				[
					[0, { item: 0 }],
					[2, { item: 2 }],
				],
			);
			for (const item of failed) {
				assert.match(item.json.error, /decision this node does not know/);
				assert.equal(item.json.loopstop, undefined, 'an error item carries no answer');
				assert.ok(item.error instanceof Error);
			}
			const others = out.filter((_, i) => i !== 0 && i !== index).flat();
			assert.deepEqual(others, []);
		});
	}

	it('operation.begin {decision: "maybe"} never lands on Execute', async () => {
		const { out } = await run({
			params: paramsFor('operation.begin'),
			answers: [ok({ decision: 'maybe' })],
			continueOnFail: true,
		});
		assert.deepEqual(sizes(out), [0, 0, 0, 0, 1]);
	});

	it('an answer without a decision is unknown too', async () => {
		const { error } = await runError({
			params: paramsFor('activation.checkTrigger'),
			answers: [ok({ reason: 'new' })],
		});
		assert.match(error.message, /does not know/);
	});
});

describe('the first output of every branching operation is the acting one', () => {
	it('accepted answers of every operation land on output 0', async () => {
		for (const key of Object.keys(MINIMAL_PARAMS)) {
			const { out } = await run({ params: paramsFor(key), answers: [ok(ACCEPTED_ANSWER[key])] });
			assert.equal(out[0].length, 1, key);
		}
	});
});
