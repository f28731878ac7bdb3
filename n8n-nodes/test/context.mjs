// A fake IExecuteFunctions for the Loop Stop node, and helpers to load the
// built code. Not a test file itself: the *.test.mjs files import it.
import assert from 'node:assert/strict';
import { createRequire } from 'node:module';

const require = createRequire(import.meta.url);

/** The built node and credential (CommonJS), and n8n-workflow as they load it. */
export const { LoopStop, ANSWER_FIELD } = require('../dist/nodes/LoopStop/LoopStop.node.js');
export const { LoopStopApi } = require('../dist/credentials/LoopStopApi.credentials.js');
export const { NodeApiError, NodeOperationError } = require('n8n-workflow');

export const NODE = Object.freeze({
	name: 'Loop Stop',
	type: 'n8n-nodes-loopstop.loopStop',
	typeVersion: 1,
	parameters: {},
	id: 'x',
	position: [0, 0],
});

export const CREDENTIALS = Object.freeze({ baseUrl: 'http://sidecar:8765/', token: 't' });

/** `a.b.c` looked up in a plain object; `undefined` when any step is missing. */
function lookup(params, path) {
	let value = params;
	for (const step of path.split('.')) {
		if (value === null || typeof value !== 'object' || !(step in value)) return undefined;
		value = value[step];
	}
	return value;
}

/**
 * Build a fake execution context.
 *
 * - `params`: the node parameters, nested like n8n stores them
 *   (`{ additionalFields: { subjectKey: 'x' } }`). A value may be a function
 *   `(itemIndex, item) => value` for per-item values (n8n evaluates
 *   expressions per item).
 * - `items`: the input items (default one empty item).
 * - `mode`: what `getMode()` answers (default `webhook`).
 * - `executionId`: what `getExecutionId()` answers (default none).
 * - `continueOnFail`: what `continueOnFail()` answers.
 * - `answers`: what `httpRequestWithAuthentication` does, one per call in
 *   order (the last one repeats): a `{statusCode, body}` object to return, an
 *   `Error` to throw, or a function `(options, callIndex) => answer`.
 *
 * Every call is recorded in `ctx.calls` as `{ credentialType, options, self }`
 * and every credential lookup in `ctx.credentialLookups`.
 */
export function makeContext({
	params = {},
	items = [{ json: {} }],
	mode = 'webhook',
	executionId = undefined,
	continueOnFail = false,
	answers = [{ statusCode: 200, body: {} }],
	credentials = CREDENTIALS,
	workflow = { id: 'wf-1', name: 'W', active: true },
	rawParams = {},
} = {}) {
	const calls = [];
	const credentialLookups = [];
	const parameterReads = [];
	const ctx = {
		calls,
		credentialLookups,
		parameterReads,
		getInputData() {
			return items;
		},
		getNodeParameter(name, itemIndex, fallback) {
			parameterReads.push({ name, itemIndex });
			let value = lookup(params, name);
			if (typeof value === 'function') value = value(itemIndex, items[itemIndex]);
			if (value === undefined) {
				// n8n-core throws for a parameter that is missing and has no fallback.
				if (fallback !== undefined) return fallback;
				throw new Error(`Could not get parameter "${name}"`);
			}
			return value;
		},
		getNode() {
			// The parameters as typed, before expressions resolve (`={{ ... }}`).
			return { ...NODE, position: [...NODE.position], parameters: structuredClone(rawParams) };
		},
		getWorkflow() {
			return { ...workflow };
		},
		getMode() {
			return mode;
		},
		getExecutionId() {
			return executionId;
		},
		continueOnFail() {
			return continueOnFail;
		},
		async getCredentials(type, itemIndex) {
			credentialLookups.push({ type, itemIndex });
			return { ...credentials };
		},
		helpers: {
			async httpRequestWithAuthentication(credentialType, options) {
				const index = calls.length;
				calls.push({ credentialType, options: structuredClone(options), self: this });
				let answer = answers.length ? answers[Math.min(index, answers.length - 1)] : undefined;
				if (typeof answer === 'function') answer = await answer(options, index);
				if (answer instanceof Error) throw answer;
				return answer;
			},
		},
	};
	return ctx;
}

/** Run the node's `execute` with a fake context; returns `{ ctx, out }`. */
export async function run(options) {
	const ctx = makeContext(options);
	const node = new LoopStop();
	const out = await node.execute.call(ctx);
	return { ctx, out };
}

/** Run the node and return the error it throws (fails the test when it does not throw). */
export async function runError(options) {
	const ctx = makeContext(options);
	const node = new LoopStop();
	let out;
	try {
		out = await node.execute.call(ctx);
	} catch (error) {
		return { ctx, error };
	}
	assert.fail(`expected execute to throw, it returned ${JSON.stringify(out)}`);
}

/** An answer with status 200 and `body`. */
export function ok(body) {
	return { statusCode: 200, body };
}

/** The output names of `resource.operation` from the node's outputs expression. */
export function outputsFor(parameters, description = new LoopStop().description) {
	const expression = description.outputs;
	if (
		typeof expression !== 'string' ||
		!expression.startsWith('={{') ||
		!expression.endsWith('}}')
	) {
		throw new Error(`outputs is not an expression: ${String(expression)}`);
	}
	const inner = expression.slice(3, -2);
	return new Function('$parameter', 'return ' + inner)(parameters);
}

/**
 * The smallest parameters each operation runs with, as n8n would hold them
 * (top-level parameters with their values, collections empty).
 */
export const MINIMAL_PARAMS = Object.freeze({
	'activation.checkTrigger': { eventKey: 'evt-1', additionalFields: {} },
	'effect.register': { targetKeys: 'row:1', content: '{"a":1}', additionalFields: {} },
	'operation.begin': { operationId: 'op-1', payload: '{"a":1}', additionalFields: {} },
	'operation.commit': { operationId: 'op-1', attempt: 1, receipt: '{"id":"r1"}' },
	'operation.fail': { operationId: 'op-1', attempt: 1, outcome: 'unknown', detail: '' },
	'operation.reconcile': {
		operationId: 'op-1',
		outcome: 'committed',
		evidence: '{"found":true}',
		receipt: '',
	},
	'operation.get': { operationId: 'op-1' },
	'task.create': { taskKey: 'ticket-1', additionalFields: {} },
	'task.admitToolCall': {
		taskId: 't1',
		tool: 'create_refund',
		kind: 'write',
		args: '{"amount":5}',
		additionalFields: {},
	},
	'task.recordResult': {
		taskId: 't1',
		callId: 'k1',
		status: 'ok',
		result: '{"ok":true}',
		additionalFields: {},
	},
	'task.complete': {
		taskId: 't1',
		check: 'refund_issued',
		input: '{"ticket":1}',
		additionalFields: {},
	},
	'task.stop': { taskId: 't1', reason: 'enough' },
	'task.get': { taskId: 't1' },
	'check.run': { checkName: 'refund_issued', input: '{"ticket":1}', additionalFields: {} },
});

/** The parameters of `key` ("resource.operation") with `extra` merged over them. */
export function paramsFor(key, extra = {}) {
	const [resource, operation] = key.split('.');
	const base = structuredClone(MINIMAL_PARAMS[key]);
	const merged = { resource, operation, ...base, ...extra };
	if (base.additionalFields || extra.additionalFields) {
		merged.additionalFields = {
			...(base.additionalFields ?? {}),
			...(extra.additionalFields ?? {}),
		};
	}
	return merged;
}

/** An answer each operation accepts (a single-output operation accepts any object). */
export const ACCEPTED_ANSWER = Object.freeze({
	'activation.checkTrigger': { decision: 'proceed' },
	'effect.register': { effect_id: 'e1' },
	'operation.begin': { decision: 'execute', operation: { attempt: 1 } },
	'operation.commit': { operation: { state: 'committed' } },
	'operation.fail': { operation: { state: 'unknown' } },
	'operation.reconcile': { operation: { state: 'committed' } },
	'operation.get': { operation: { state: 'committed' } },
	'task.create': { task: { task_id: 't1' } },
	'task.admitToolCall': { decision: 'execute', call_id: 'k1' },
	'task.recordResult': { decision: 'recorded' },
	'task.complete': { decision: 'completed' },
	'task.stop': { task: { status: 'stopped' } },
	'task.get': { task: { task_id: 't1' } },
	'check.run': { passed: true },
});
