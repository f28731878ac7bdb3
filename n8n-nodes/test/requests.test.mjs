// The request each operation builds: method, URL, body or query, credential.
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { ACCEPTED_ANSWER, MINIMAL_PARAMS, ok, paramsFor, run, runError } from './context.mjs';

const BASE = 'http://sidecar:8765';

/** Run `key` once with `extra` parameters and return the one recorded call. */
async function request(key, extra = {}, options = {}) {
	const { ctx } = await run({
		params: paramsFor(key, extra),
		answers: [ok(ACCEPTED_ANSWER[key])],
		...options,
	});
	assert.equal(ctx.calls.length, 1, 'one HTTP call per item');
	return ctx.calls[0];
}

describe('every operation: transport', () => {
	for (const key of Object.keys(MINIMAL_PARAMS)) {
		it(`${key} sends through loopStopApi with a full response and no status errors`, async () => {
			const { ctx } = await run({
				params: paramsFor(key),
				answers: [ok(ACCEPTED_ANSWER[key])],
			});
			assert.equal(ctx.calls.length, 1);
			const [call] = ctx.calls;
			assert.equal(call.credentialType, 'loopStopApi');
			assert.equal(call.self, ctx, 'the helper is called with the execution context as this');
			assert.equal(call.options.json, true);
			assert.equal(call.options.returnFullResponse, true);
			assert.equal(call.options.ignoreHttpStatusErrors, true);
			assert.ok(call.options.url.startsWith(`${BASE}/v1/`), call.options.url);
			assert.ok(
				!call.options.url.includes('//v1'),
				'the trailing slash of the base URL is trimmed',
			);
			assert.deepEqual(ctx.credentialLookups, [{ type: 'loopStopApi', itemIndex: 0 }]);
		});
	}

	it('trims every trailing slash of the base URL', async () => {
		const call = await request(
			'operation.get',
			{},
			{
				credentials: { baseUrl: 'https://ls.example.com:9000///', token: 't' },
			},
		);
		assert.equal(call.options.url, 'https://ls.example.com:9000/v1/operations/op-1');
	});

	it('keeps a base URL without a trailing slash as it is', async () => {
		const call = await request(
			'task.get',
			{},
			{
				credentials: { baseUrl: 'http://127.0.0.1:8765', token: 't' },
			},
		);
		assert.equal(call.options.url, 'http://127.0.0.1:8765/v1/tasks/t1');
	});

	it('maps the execution mode: manual is test, anything else production', async () => {
		for (const [mode, expected] of [
			['manual', 'test'],
			['webhook', 'production'],
			['trigger', 'production'],
			['integrated', 'production'],
		]) {
			const call = await request('task.stop', {}, { mode });
			assert.equal(call.options.body.execution_mode, expected, mode);
		}
	});
});

describe('every operation: execution id', () => {
	for (const key of Object.keys(MINIMAL_PARAMS)) {
		it(`${key} carries $execution.id as execution_id in its body`, async () => {
			const call = await request(key, {}, { executionId: '4711' });
			if (call.options.body === undefined) {
				// A GET: the query holds no execution id (the sidecar refuses unknown fields).
				assert.equal('execution_id' in (call.options.qs ?? {}), false);
				assert.ok('execution_mode' in (call.options.qs ?? {}));
				return;
			}
			assert.equal(call.options.body.execution_id, '4711');
			assert.ok('execution_mode' in call.options.body);
		});
	}

	it('leaves out an id the sidecar would refuse, and none at all', async () => {
		for (const executionId of [undefined, '', 'a/b', 'x'.repeat(65)]) {
			const call = await request('task.stop', {}, { executionId });
			assert.equal('execution_id' in call.options.body, false, String(executionId));
		}
	});
});

describe('activation.checkTrigger', () => {
	it('POSTs /v1/activations with every field in snake_case', async () => {
		const call = await request(
			'activation.checkTrigger',
			{
				eventKey: ' sheet:orders:17 ',
				additionalFields: {
					subjectKey: 'ana@example.com',
					relatedKeys: '<m1@x>, <m2@x>\n<m3@x>\r\n Orders 2024 ',
					trigger: 'Gmail Trigger',
					marker: 'ls1.abc',
					content: '{"status":"paid","amount":5}',
				},
			},
			{ items: [{ json: { row: 17, status: 'paid' } }] },
		);
		assert.equal(call.options.method, 'POST');
		assert.equal(call.options.url, `${BASE}/v1/activations`);
		assert.equal(call.options.qs, undefined);
		assert.deepEqual(call.options.body, {
			workflow: 'wf-1',
			execution_mode: 'production',
			event_key: 'sheet:orders:17',
			subject_key: 'ana@example.com',
			related_keys: ['<m1@x>', '<m2@x>', '<m3@x>', 'Orders 2024'],
			trigger: 'Gmail Trigger',
			marker: 'ls1.abc',
			content: { status: 'paid', amount: 5 },
			event: { row: 17, status: 'paid' },
		});
	});

	it('omits empty optional fields and sends the item as the event', async () => {
		const call = await request(
			'activation.checkTrigger',
			{
				eventKey: '  ',
				additionalFields: {
					subjectKey: '',
					relatedKeys: ' , ',
					trigger: '',
					marker: '',
					content: '',
				},
			},
			{ mode: 'manual', items: [{ json: { body: { id: 3 } } }] },
		);
		assert.deepEqual(call.options.body, {
			workflow: 'wf-1',
			execution_mode: 'test',
			event: { body: { id: 3 } },
		});
	});

	it('takes related keys as an array and content as an object from an expression', async () => {
		const call = await request('activation.checkTrigger', {
			additionalFields: { relatedKeys: [' a ', 'b', ''], content: { x: [1, 2] } },
		});
		assert.deepEqual(call.options.body.related_keys, ['a', 'b']);
		assert.deepEqual(call.options.body.content, { x: [1, 2] });
	});

	it('builds each item from its own parameter values', async () => {
		const items = [{ json: { id: 'a' } }, { json: { id: 'b/c' } }];
		const { ctx } = await run({
			params: paramsFor('activation.checkTrigger', {
				eventKey: (i, item) => `row:${item.json.id}`,
			}),
			items,
			answers: [ok({ decision: 'proceed' })],
		});
		assert.deepEqual(
			ctx.calls.map((c) => [c.options.body.event_key, c.options.body.event]),
			[
				['row:a', { id: 'a' }],
				['row:b/c', { id: 'b/c' }],
			],
		);
		assert.deepEqual(
			ctx.credentialLookups.map((l) => l.itemIndex),
			[0, 1],
		);
	});
});

describe('effect.register', () => {
	it('POSTs /v1/effects with target keys split and content parsed', async () => {
		const call = await request('effect.register', {
			targetKeys: 'sheet:orders:1, sheet:orders:2\nsheet:Orders 2024:row:3',
			content: '{"status":"paid"}',
			additionalFields: { chainId: 'c0123', ttlS: 3600, strict: true },
		});
		assert.equal(call.options.method, 'POST');
		assert.equal(call.options.url, `${BASE}/v1/effects`);
		assert.deepEqual(call.options.body, {
			workflow: 'wf-1',
			execution_mode: 'production',
			chain_id: 'c0123',
			target_keys: ['sheet:orders:1', 'sheet:orders:2', 'sheet:Orders 2024:row:3'],
			content: { status: 'paid' },
			ttl_s: 3600,
			strict: true,
		});
	});

	it('omits strict=false, a zero TTL and an empty chain; Match on Key Only sends {}', async () => {
		const call = await request(
			'effect.register',
			{
				targetKeys: ['k1', 'k2'],
				content: '{"ignored":true}',
				keyOnly: true,
				additionalFields: { chainId: '', ttlS: 0, strict: false },
			},
			{ mode: 'manual' },
		);
		assert.deepEqual(call.options.body, {
			workflow: 'wf-1',
			execution_mode: 'test',
			target_keys: ['k1', 'k2'],
			content: {},
		});
	});

	for (const content of ['', '{}', '[1]', '"text"']) {
		it(`refuses content ${JSON.stringify(content)} without Match on Key Only, calling nothing`, async () => {
			const { ctx, error } = await runError({
				params: paramsFor('effect.register', { content, keyOnly: false }),
			});
			assert.match(error.message, /record as written/);
			assert.match(error.description, /Match on Key Only/);
			assert.equal(ctx.calls.length, 0);
		});
	}
});

describe('operation.begin', () => {
	it('POSTs /v1/operations/{id}/begin with the id URL-encoded and every field', async () => {
		const call = await request('operation.begin', {
			operationId: 'a/b c',
			payload: '{"amount":5,"to":"ana"}',
			additionalFields: {
				taskId: 't0123',
				chainId: 'c0123',
				leaseS: 30,
				reconcileCheck: 'order_exists',
				reconcileInput: '{"order":"o-1"}',
			},
		});
		assert.equal(call.options.method, 'POST');
		assert.equal(call.options.url, `${BASE}/v1/operations/a%2Fb%20c/begin`);
		assert.deepEqual(call.options.body, {
			workflow: 'wf-1',
			execution_mode: 'production',
			payload: { amount: 5, to: 'ana' },
			task_id: 't0123',
			chain_id: 'c0123',
			lease_s: 30,
			reconcile: { check: 'order_exists', input: { order: 'o-1' } },
		});
	});

	it('omits the empty optional fields; a reconcile check without input has no input', async () => {
		const call = await request(
			'operation.begin',
			{
				operationId: 'crm:order:1',
				payload: { id: 1 },
				additionalFields: { reconcileCheck: 'order_exists', reconcileInput: '', leaseS: 0 },
			},
			{ mode: 'manual' },
		);
		assert.equal(call.options.url, `${BASE}/v1/operations/crm%3Aorder%3A1/begin`);
		assert.deepEqual(call.options.body, {
			workflow: 'wf-1',
			execution_mode: 'test',
			payload: { id: 1 },
			reconcile: { check: 'order_exists' },
		});
	});

	it('sends no reconcile without a reconcile check, even with an input', async () => {
		const call = await request('operation.begin', {
			additionalFields: { reconcileInput: '{"order":"o-1"}' },
		});
		assert.equal('reconcile' in call.options.body, false);
	});

	it('sends payload null when the payload is empty (the sidecar requires the field)', async () => {
		const call = await request('operation.begin', { payload: '' });
		assert.ok('payload' in call.options.body);
		assert.equal(call.options.body.payload, null);
	});

	it('refuses an empty operation ID without calling the sidecar', async () => {
		const { ctx, error } = await runError({
			params: paramsFor('operation.begin', { operationId: '  ' }),
		});
		assert.match(error.message, /"operationId" is empty/);
		assert.equal(ctx.calls.length, 0);
	});
});

describe('operation.commit', () => {
	it('POSTs /v1/operations/{id}/commit with attempt and receipt', async () => {
		const call = await request('operation.commit', {
			operationId: 'a/b c',
			attempt: '2',
			receipt: '{"id":"crm-9"}',
		});
		assert.equal(call.options.method, 'POST');
		assert.equal(call.options.url, `${BASE}/v1/operations/a%2Fb%20c/commit`);
		assert.deepEqual(call.options.body, {
			workflow: 'wf-1',
			execution_mode: 'production',
			attempt: 2,
			receipt: { id: 'crm-9' },
		});
	});

	it('takes the receipt as an object and sends the test mode', async () => {
		const call = await request(
			'operation.commit',
			{ attempt: 3, receipt: { id: 'x', n: [1] } },
			{ mode: 'manual' },
		);
		assert.deepEqual(call.options.body, {
			workflow: 'wf-1',
			execution_mode: 'test',
			attempt: 3,
			receipt: { id: 'x', n: [1] },
		});
	});
});

describe('operation.fail', () => {
	it('POSTs /v1/operations/{id}/fail with attempt, outcome and detail', async () => {
		const call = await request('operation.fail', {
			operationId: 'a/b c',
			attempt: 1,
			outcome: 'not_committed',
			detail: ' HTTP 409 from the CRM ',
		});
		assert.equal(call.options.method, 'POST');
		assert.equal(call.options.url, `${BASE}/v1/operations/a%2Fb%20c/fail`);
		assert.deepEqual(call.options.body, {
			workflow: 'wf-1',
			execution_mode: 'production',
			attempt: 1,
			outcome: 'not_committed',
			detail: 'HTTP 409 from the CRM',
		});
	});

	it('omits an empty detail and cuts a long one to 2000 characters', async () => {
		const empty = await request('operation.fail', { detail: '' }, { mode: 'manual' });
		assert.deepEqual(empty.options.body, {
			workflow: 'wf-1',
			execution_mode: 'test',
			attempt: 1,
			outcome: 'unknown',
		});
		const long = await request('operation.fail', { detail: 'x'.repeat(5000) });
		assert.equal(long.options.body.detail.length, 2000);
	});
});

describe('operation.reconcile', () => {
	it('POSTs /v1/operations/{id}/reconcile with outcome, evidence and receipt', async () => {
		const call = await request('operation.reconcile', {
			operationId: 'a/b c',
			outcome: 'committed',
			evidence: '{"found":true,"id":"crm-9"}',
			receipt: '{"id":"crm-9"}',
		});
		assert.equal(call.options.method, 'POST');
		assert.equal(call.options.url, `${BASE}/v1/operations/a%2Fb%20c/reconcile`);
		assert.deepEqual(call.options.body, {
			workflow: 'wf-1',
			execution_mode: 'production',
			outcome: 'committed',
			evidence: { found: true, id: 'crm-9' },
			receipt: { id: 'crm-9' },
		});
	});

	it('omits an empty receipt', async () => {
		const call = await request(
			'operation.reconcile',
			{ outcome: 'not_committed', evidence: { found: false }, receipt: '' },
			{ mode: 'manual' },
		);
		assert.deepEqual(call.options.body, {
			workflow: 'wf-1',
			execution_mode: 'test',
			outcome: 'not_committed',
			evidence: { found: false },
		});
	});
});

describe('operation.get', () => {
	it('GETs /v1/operations/{id} with execution_mode in the query and no body', async () => {
		const call = await request('operation.get', { operationId: 'a/b c' });
		assert.equal(call.options.method, 'GET');
		assert.equal(call.options.url, `${BASE}/v1/operations/a%2Fb%20c`);
		assert.deepEqual(call.options.qs, { workflow: 'wf-1', execution_mode: 'production' });
		assert.equal(call.options.body, undefined);
		const manual = await request('operation.get', {}, { mode: 'manual' });
		assert.deepEqual(manual.options.qs, { workflow: 'wf-1', execution_mode: 'test' });
	});
});

describe('task.create', () => {
	it('POSTs /v1/tasks with every field', async () => {
		const call = await request('task.create', {
			taskKey: 'ticket-42',
			additionalFields: {
				chainId: 'c0123',
				policy: 'support',
				limits: '{"max_tool_calls":10,"max_same_call":2}',
			},
		});
		assert.equal(call.options.method, 'POST');
		assert.equal(call.options.url, `${BASE}/v1/tasks`);
		assert.deepEqual(call.options.body, {
			workflow: 'wf-1',
			execution_mode: 'production',
			task_key: 'ticket-42',
			chain_id: 'c0123',
			policy: 'support',
			limits: { max_tool_calls: 10, max_same_call: 2 },
		});
	});

	it('omits empty fields and empty limits ({} is the default)', async () => {
		const call = await request(
			'task.create',
			{ taskKey: '', additionalFields: { chainId: '', policy: '', limits: '{}' } },
			{ mode: 'manual' },
		);
		assert.deepEqual(call.options.body, { workflow: 'wf-1', execution_mode: 'test' });
	});
});

describe('task.admitToolCall', () => {
	it('POSTs /v1/tasks/{id}/tool-calls with tool, kind, args and operation id', async () => {
		const call = await request('task.admitToolCall', {
			taskId: 'a/b c',
			tool: ' create_refund ',
			kind: 'write',
			args: '{"amount":5}',
			writeOperationId: 'refund:42',
		});
		assert.equal(call.options.method, 'POST');
		assert.equal(call.options.url, `${BASE}/v1/tasks/a%2Fb%20c/tool-calls`);
		assert.deepEqual(call.options.body, {
			execution_mode: 'production',
			tool: 'create_refund',
			kind: 'write',
			args: { amount: 5 },
			operation_id: 'refund:42',
		});
	});

	it('sends no operation id for a read (even one left set) and args null when empty', async () => {
		const call = await request(
			'task.admitToolCall',
			{ kind: 'read', args: '', writeOperationId: 'left-over' },
			{ mode: 'manual' },
		);
		assert.deepEqual(call.options.body, {
			execution_mode: 'test',
			tool: 'create_refund',
			kind: 'read',
			args: null,
		});
	});
});

describe('task.recordResult', () => {
	it('POSTs /v1/tasks/{id}/tool-calls/{call}/result with both ids encoded', async () => {
		const call = await request('task.recordResult', {
			taskId: 'a/b c',
			callId: 'k?1#',
			status: 'needs_human',
			result: '{"rows":[1,2]}',
			additionalFields: { receipt: '{"id":"r1"}', evidence: '{"revision":12,"done":false}' },
		});
		assert.equal(call.options.method, 'POST');
		assert.equal(call.options.url, `${BASE}/v1/tasks/a%2Fb%20c/tool-calls/k%3F1%23/result`);
		assert.deepEqual(call.options.body, {
			execution_mode: 'production',
			status: 'needs_human',
			result: { rows: [1, 2] },
			receipt: { id: 'r1' },
			evidence: { revision: 12, done: false },
		});
	});

	it('omits an empty receipt, empty result and empty evidence ({})', async () => {
		const call = await request(
			'task.recordResult',
			{ result: '', additionalFields: { receipt: '', evidence: '{}' } },
			{ mode: 'manual' },
		);
		assert.deepEqual(call.options.body, { execution_mode: 'test', status: 'ok' });
	});

	it('refuses an empty call ID without calling the sidecar', async () => {
		const { ctx, error } = await runError({
			params: paramsFor('task.recordResult', { callId: '' }),
		});
		assert.match(error.message, /"callId" is empty/);
		assert.equal(ctx.calls.length, 0);
	});
});

describe('task.complete', () => {
	it('POSTs /v1/tasks/{id}/complete with check, input and evidence', async () => {
		const call = await request('task.complete', {
			taskId: 'a/b c',
			check: 'refund_issued',
			input: '{"ticket":42}',
			additionalFields: { evidence: '{"done":true,"revision":12}' },
		});
		assert.equal(call.options.method, 'POST');
		assert.equal(call.options.url, `${BASE}/v1/tasks/a%2Fb%20c/complete`);
		assert.deepEqual(call.options.body, {
			execution_mode: 'production',
			check: 'refund_issued',
			input: { ticket: 42 },
			evidence: { done: true, revision: 12 },
		});
	});

	it('omits an empty check, input and evidence', async () => {
		const call = await request(
			'task.complete',
			{ check: '', input: '', additionalFields: { evidence: '{}' } },
			{ mode: 'manual' },
		);
		assert.deepEqual(call.options.body, { execution_mode: 'test' });
	});
});

describe('task.stop', () => {
	it('POSTs /v1/tasks/{id}/stop with the reason', async () => {
		const call = await request('task.stop', { taskId: 'a/b c', reason: ' customer asked ' });
		assert.equal(call.options.method, 'POST');
		assert.equal(call.options.url, `${BASE}/v1/tasks/a%2Fb%20c/stop`);
		assert.deepEqual(call.options.body, { execution_mode: 'production', reason: 'customer asked' });
	});

	it('sends "stopped" when the reason is empty (the sidecar needs one)', async () => {
		const call = await request('task.stop', { reason: '' }, { mode: 'manual' });
		assert.deepEqual(call.options.body, { execution_mode: 'test', reason: 'stopped' });
	});
});

describe('task.get', () => {
	it('GETs /v1/tasks/{id} with execution_mode in the query and no body', async () => {
		const call = await request('task.get', { taskId: 'a/b c' });
		assert.equal(call.options.method, 'GET');
		assert.equal(call.options.url, `${BASE}/v1/tasks/a%2Fb%20c`);
		assert.deepEqual(call.options.qs, { execution_mode: 'production' });
		assert.equal(call.options.body, undefined);
		const manual = await request('task.get', {}, { mode: 'manual' });
		assert.deepEqual(manual.options.qs, { execution_mode: 'test' });
	});

	it('refuses an empty task ID without calling the sidecar', async () => {
		const { ctx, error } = await runError({ params: paramsFor('task.get', { taskId: '' }) });
		assert.match(error.message, /"taskId" is empty/);
		assert.equal(ctx.calls.length, 0);
	});
});

describe('check.run', () => {
	it('POSTs /v1/checks/{name} with input and task id', async () => {
		const call = await request('check.run', {
			checkName: 'a/b c',
			input: '{"ticket":42}',
			additionalFields: { taskId: 't0123' },
		});
		assert.equal(call.options.method, 'POST');
		assert.equal(call.options.url, `${BASE}/v1/checks/a%2Fb%20c`);
		assert.deepEqual(call.options.body, {
			execution_mode: 'production',
			input: { ticket: 42 },
			task_id: 't0123',
		});
	});

	it('takes the input as an object and omits an empty task id', async () => {
		const call = await request(
			'check.run',
			{ input: { ticket: 7 }, additionalFields: { taskId: '' } },
			{ mode: 'manual' },
		);
		assert.deepEqual(call.options.body, { execution_mode: 'test', input: { ticket: 7 } });
	});
});

describe('bodies carry only the fields the sidecar accepts', () => {
	// The sidecar's request models forbid unknown fields (a typo is a 422).
	const allowed = {
		'activation.checkTrigger': [
			'execution_mode',
			'workflow',
			'trigger',
			'event_key',
			'related_keys',
			'subject_key',
			'content',
			'event',
			'marker',
		],
		'effect.register': [
			'execution_mode',
			'chain_id',
			'workflow',
			'target_keys',
			'target_key',
			'content',
			'ttl_s',
			'strict',
		],
		'operation.begin': [
			'execution_mode',
			'payload',
			'workflow',
			'task_id',
			'chain_id',
			'lease_s',
			'reconcile',
		],
		'operation.commit': ['workflow', 'execution_mode', 'attempt', 'receipt', 'result'],
		'operation.fail': ['workflow', 'execution_mode', 'attempt', 'outcome', 'detail'],
		'operation.reconcile': ['workflow', 'execution_mode', 'outcome', 'receipt', 'evidence'],
		'task.create': ['execution_mode', 'task_key', 'workflow', 'chain_id', 'policy', 'limits'],
		'task.admitToolCall': ['execution_mode', 'tool', 'kind', 'args', 'operation_id'],
		'task.recordResult': ['execution_mode', 'status', 'result', 'receipt', 'evidence'],
		'task.complete': ['execution_mode', 'check', 'input', 'evidence'],
		'task.stop': ['execution_mode', 'reason'],
		'check.run': ['execution_mode', 'input', 'task_id'],
	};
	const full = {
		'activation.checkTrigger': {
			additionalFields: {
				subjectKey: 's',
				relatedKeys: 'r',
				trigger: 't',
				marker: 'm',
				content: '{}',
			},
		},
		'effect.register': { additionalFields: { chainId: 'c', ttlS: 5, strict: true } },
		'operation.begin': {
			additionalFields: {
				taskId: 't',
				chainId: 'c',
				leaseS: 5,
				reconcileCheck: 'k',
				reconcileInput: '{}',
			},
		},
		'operation.fail': { detail: 'd' },
		'operation.reconcile': { receipt: '{}' },
		'task.create': { additionalFields: { chainId: 'c', policy: 'p', limits: '{"max_idle":1}' } },
		'task.admitToolCall': { kind: 'write', writeOperationId: 'o' },
		'task.recordResult': { additionalFields: { receipt: '{}', evidence: '{"done":true}' } },
		'task.complete': { additionalFields: { evidence: '{"done":true}' } },
		'check.run': { additionalFields: { taskId: 't' } },
	};
	for (const [key, fields] of Object.entries(allowed)) {
		it(key, async () => {
			const call = await request(key, full[key] ?? {});
			const extra = Object.keys(call.options.body).filter((f) => !fields.includes(f));
			assert.deepEqual(extra, []);
		});
	}
});

describe('JSON parameters and path segments', () => {
	it('keeps an expression’s non-JSON string result as a string, parses a JSON one', async () => {
		const call = await request(
			'check.run',
			{ input: 'A-100', additionalFields: {} },
			{ rawParams: { input: '={{ $json.order_id }}' } },
		);
		assert.equal(call.options.body.input, 'A-100');
		const parsed = await request(
			'check.run',
			{ input: '{"order_id":"A-100"}', additionalFields: {} },
			{ rawParams: { input: '={{ JSON.stringify({ order_id: $json.order_id }) }}' } },
		);
		assert.deepEqual(parsed.options.body.input, { order_id: 'A-100' });
	});

	it('still refuses typed text that is not JSON', async () => {
		const { ctx, error } = await runError({
			params: paramsFor('check.run', { input: 'A-100' }),
			rawParams: { input: 'A-100' },
		});
		assert.match(error.message, /"input" is not valid JSON/);
		assert.equal(ctx.calls.length, 0);
	});

	for (const id of ['.', '..']) {
		it(`refuses the id ${JSON.stringify(id)}, which a URL would resolve away`, async () => {
			const { ctx, error } = await runError({
				params: paramsFor('operation.get', { operationId: id }),
			});
			assert.match(error.message, /"operationId" is empty or not an ID/);
			assert.equal(ctx.calls.length, 0);
		});
	}

	it('sets a request timeout', async () => {
		const call = await request('operation.get', { operationId: 'x' });
		assert.equal(call.options.timeout, 30000);
	});
});

describe('activation.checkTrigger: Event', () => {
	it('sends the given event instead of the whole item', async () => {
		const call = await request('activation.checkTrigger', {
			additionalFields: { event: '{"headers":{"x-loopstop-chain":"ls1.c.0.s"}}' },
		});
		assert.deepEqual(call.options.body.event, { headers: { 'x-loopstop-chain': 'ls1.c.0.s' } });
	});
});
