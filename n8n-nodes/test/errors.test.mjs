// Problem answers, network errors and invalid JSON parameters.
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import {
	MINIMAL_PARAMS,
	NodeApiError,
	NodeOperationError,
	ok,
	outputsFor,
	paramsFor,
	run,
	runError,
} from './context.mjs';

const PROBLEM_422 = {
	statusCode: 422,
	body: {
		type: 'https://loopstop.dev/problems/validation',
		title: 'Invalid request',
		status: 422,
		detail: 'The request body does not match the schema.',
		errors: [
			{ loc: ['body', 'payload'], msg: 'Field required' },
			{ loc: ['body', 'attempt'], msg: 'must be >= 1' },
		],
	},
};

const PROBLEM_503 = {
	statusCode: 503,
	body: {
		type: 'https://loopstop.dev/problems/unavailable',
		title: 'Store unavailable',
		status: 503,
		detail: 'The store does not answer; nothing was decided.',
	},
};

/** The output an error goes to under Continue On Fail (0 for single-output operations). */
const ERROR_OUTPUT = {
	'activation.checkTrigger': 'Drop',
	'operation.begin': 'Refused',
	'task.admitToolCall': 'Deny',
	'task.complete': 'Continue',
	'check.run': 'Fail',
};

function errorIndex(key) {
	const outputs = outputsFor(paramsFor(key));
	if (!(key in ERROR_OUTPUT)) return 0;
	return outputs.findIndex((o) => o.displayName === ERROR_OUTPUT[key]);
}

function networkError() {
	return Object.assign(new Error('connect ECONNREFUSED 10.0.0.9:8765'), { code: 'ECONNREFUSED' });
}

describe('a problem+json answer is an error', () => {
	it('422: the title is the message, detail and field in the description, httpCode 422', async () => {
		const { error } = await runError({
			params: paramsFor('operation.begin'),
			items: [{ json: {} }, { json: {} }],
			answers: [ok({ decision: 'execute' }), PROBLEM_422],
		});
		assert.ok(error instanceof NodeApiError, error.constructor.name);
		assert.equal(error.message, 'Invalid request');
		assert.match(error.description, /The request body does not match the schema\./);
		assert.match(error.description, /body\.payload/);
		assert.match(error.description, /Field required/);
		assert.equal(error.httpCode, '422');
		assert.equal(error.context.itemIndex, 1);
	});

	it('503: the title is the message and httpCode is 503', async () => {
		const { error } = await runError({ params: paramsFor('task.create'), answers: [PROBLEM_503] });
		assert.ok(error instanceof NodeApiError);
		assert.equal(error.message, 'Store unavailable');
		assert.match(error.description, /nothing was decided/);
		assert.equal(error.httpCode, '503');
		assert.equal(error.context.itemIndex, 0);
	});

	it('a 401 problem (wrong token) names the status', async () => {
		const { error } = await runError({
			params: paramsFor('task.get'),
			answers: [
				{
					statusCode: 401,
					body: {
						type: 'about:blank',
						title: 'Unauthorized',
						status: 401,
						detail: 'Unknown token.',
					},
				},
			],
		});
		assert.equal(error.message, 'Unauthorized');
		assert.equal(error.httpCode, '401');
		assert.match(error.description, /Unknown token/);
	});

	it('an error status without a problem body still is an error with its status', async () => {
		const { error } = await runError({
			params: paramsFor('operation.get'),
			answers: [{ statusCode: 502, body: '<html>Bad Gateway</html>' }],
		});
		assert.ok(error instanceof NodeApiError);
		assert.match(error.message, /502/);
		assert.equal(error.httpCode, '502');
	});

	it('a problem with a decision field is still an error, never a branch', async () => {
		const { out } = await run({
			params: paramsFor('operation.begin'),
			answers: [
				{
					statusCode: 409,
					body: { title: 'Conflict', status: 409, detail: 'x', decision: 'execute' },
				},
			],
			continueOnFail: true,
		});
		assert.deepEqual(
			out.map((o) => o.length),
			[0, 0, 0, 0, 1],
		);
	});

	for (const key of Object.keys(MINIMAL_PARAMS)) {
		it(`${key}: a 422 throws, and under Continue On Fail goes to output ${errorIndex(key)}`, async () => {
			const { error } = await runError({ params: paramsFor(key), answers: [PROBLEM_422] });
			assert.ok(error instanceof NodeApiError);
			assert.equal(error.message, 'Invalid request');
			assert.equal(error.httpCode, '422');

			const { out } = await run({
				params: paramsFor(key),
				items: [{ json: { keep: 'me' } }],
				answers: [PROBLEM_422],
				continueOnFail: true,
			});
			const index = errorIndex(key);
			assert.ok(index >= 0);
			out.forEach((o, i) => assert.equal(o.length, i === index ? 1 : 0, `output ${i}`));
			const [item] = out[index];
			assert.equal(item.json.keep, 'me');
			assert.equal(item.json.error, 'Invalid request');
			assert.equal(item.json.loopstop, undefined);
			assert.deepEqual(item.pairedItem, { item: 0 });
			assert.ok(item.error instanceof NodeApiError);
		});
	}
});

describe('a network error is an error', () => {
	it('a thrown request becomes a NodeApiError with the item index', async () => {
		const { ctx, error } = await runError({
			params: paramsFor('operation.begin'),
			items: [{ json: {} }, { json: {} }],
			answers: [ok({ decision: 'execute' }), networkError()],
		});
		assert.ok(error instanceof NodeApiError, error.constructor.name);
		assert.equal(error.context.itemIndex, 1);
		assert.equal(ctx.calls.length, 2);
		// The sidecar's address in the message, n8n's code and text in the description.
		assert.equal(error.message, 'Loop Stop sidecar unreachable at http://sidecar:8765');
		assert.match(error.description, /ECONNREFUSED/);
	});

	it('an error without a code keeps the node’s message', async () => {
		const { error } = await runError({
			params: paramsFor('activation.checkTrigger'),
			answers: [new Error('socket hang up')],
		});
		assert.ok(error instanceof NodeApiError);
		assert.equal(error.message, 'Loop Stop sidecar unreachable at http://sidecar:8765');
	});

	for (const key of Object.keys(ERROR_OUTPUT)) {
		it(`${key}: under Continue On Fail goes to ${ERROR_OUTPUT[key]}`, async () => {
			const { out } = await run({
				params: paramsFor(key),
				items: [{ json: { n: 1 } }],
				answers: [networkError()],
				continueOnFail: true,
			});
			const index = errorIndex(key);
			out.forEach((o, i) => assert.equal(o.length, i === index ? 1 : 0, `output ${i}`));
			assert.equal(out[index][0].json.n, 1);
			assert.equal(typeof out[index][0].json.error, 'string');
			assert.ok(out[index][0].json.error.length > 0);
		});
	}

	it('a single-output operation keeps going after a failed item under Continue On Fail', async () => {
		const { out } = await run({
			params: paramsFor('task.get'),
			items: [{ json: { n: 0 } }, { json: { n: 1 } }],
			answers: [networkError(), ok({ task: {} })],
			continueOnFail: true,
		});
		assert.equal(out.length, 1);
		assert.deepEqual(
			out[0].map((item) => [item.json.n, 'error' in item.json, item.pairedItem.item]),
			[
				[0, true, 0],
				[1, false, 1],
			],
		);
	});
});

describe('invalid JSON in a json parameter', () => {
	/** [operation, parameter path, extra parameters putting the bad JSON there]. */
	const CASES = [
		[
			'activation.checkTrigger',
			'additionalFields.content',
			{ additionalFields: { content: '{bad' } },
		],
		['effect.register', 'content', { content: '{"a":' }],
		['operation.begin', 'payload', { payload: '{not json' }],
		[
			'operation.begin',
			'additionalFields.reconcileInput',
			{ additionalFields: { reconcileCheck: 'c', reconcileInput: '[1,' } },
		],
		['operation.commit', 'receipt', { receipt: "{'id': 1}" }],
		['operation.reconcile', 'evidence', { evidence: 'found' }],
		['operation.reconcile', 'receipt', { receipt: '{' }],
		['task.create', 'additionalFields.limits', { additionalFields: { limits: '{max:1}' } }],
		['task.admitToolCall', 'args', { args: '{"a":1,}' }],
		['task.recordResult', 'result', { result: 'ok then' }],
		['task.recordResult', 'additionalFields.receipt', { additionalFields: { receipt: '{' } }],
		['task.recordResult', 'additionalFields.evidence', { additionalFields: { evidence: 'done' } }],
		['task.complete', 'input', { input: '{"ticket":}' }],
		['task.complete', 'additionalFields.evidence', { additionalFields: { evidence: '{done}' } }],
		['check.run', 'input', { input: 'undefined' }],
	];

	for (const [key, name, extra] of CASES) {
		it(`${key}: "${name}" throws naming it, with no HTTP call`, async () => {
			const { ctx, error } = await runError({ params: paramsFor(key, extra) });
			assert.ok(error instanceof NodeOperationError, error.constructor.name);
			assert.equal(error.message, `The parameter "${name}" is not valid JSON`);
			assert.equal(error.context.itemIndex, 0);
			assert.equal(ctx.calls.length, 0);
		});
	}

	it('names the item whose parameter is invalid', async () => {
		const { ctx, error } = await runError({
			params: paramsFor('operation.begin', { payload: (i) => (i === 1 ? '{' : '{"ok":1}') }),
			items: [{ json: {} }, { json: {} }],
			answers: [ok({ decision: 'execute' })],
		});
		assert.equal(error.context.itemIndex, 1);
		assert.equal(ctx.calls.length, 1, 'only the first item was sent');
	});

	it('under Continue On Fail the item goes to the non-acting output, still without a call', async () => {
		const { ctx, out } = await run({
			params: paramsFor('operation.begin', { payload: '{' }),
			continueOnFail: true,
		});
		assert.equal(ctx.calls.length, 0);
		assert.deepEqual(
			out.map((o) => o.length),
			[0, 0, 0, 0, 1],
		);
		assert.equal(out[4][0].json.error, 'The parameter "payload" is not valid JSON');
	});

	it('JSON scalars and arrays given as strings are parsed', async () => {
		const { ctx } = await run({
			params: paramsFor('operation.commit', { receipt: '"crm-9"' }),
			answers: [ok({})],
		});
		assert.equal(ctx.calls[0].options.body.receipt, 'crm-9');
		const { ctx: ctx2 } = await run({
			params: paramsFor('task.admitToolCall', { args: ' [1, 2] ' }),
			answers: [ok({ decision: 'execute' })],
		});
		assert.deepEqual(ctx2.calls[0].options.body.args, [1, 2]);
	});
});
