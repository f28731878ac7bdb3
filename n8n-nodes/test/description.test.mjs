// The node description (outputs, operations) and the credential.
import assert from 'node:assert/strict';
import { existsSync } from 'node:fs';
import { resolve } from 'node:path';
import { describe, it } from 'node:test';
import {
	ACCEPTED_ANSWER,
	LoopStop,
	LoopStopApi,
	MINIMAL_PARAMS,
	NodeOperationError,
	ok,
	outputsFor,
	paramsFor,
	run,
	runError,
} from './context.mjs';

const description = new LoopStop().description;

/** Every resource and operation value the description offers. */
function offered() {
	const resources = description.properties.find((p) => p.name === 'resource');
	const list = [];
	for (const { value: resource } of resources.options) {
		const ops = description.properties.filter(
			(p) => p.name === 'operation' && p.displayOptions?.show?.resource?.includes(resource),
		);
		assert.equal(ops.length, 1, `one operation selector for ${resource}`);
		for (const { value } of ops[0].options) list.push(`${resource}.${value}`);
	}
	return list;
}

const EXPECTED_OUTPUTS = {
	'activation.checkTrigger': ['Proceed', 'Drop'],
	'operation.begin': ['Execute', 'Replay', 'Wait', 'Reconcile', 'Refused'],
	'task.admitToolCall': ['Execute', 'Replay', 'Deny'],
	'task.complete': ['Done', 'Continue', 'Ended'],
	'check.run': ['Pass', 'Fail'],
};

describe('outputs expression', () => {
	it('is an n8n expression string', () => {
		assert.equal(typeof description.outputs, 'string');
		assert.ok(description.outputs.startsWith('={{'));
		assert.ok(description.outputs.endsWith('}}'));
	});

	for (const [key, names] of Object.entries(EXPECTED_OUTPUTS)) {
		it(`${key} → ${names.join(', ')}`, () => {
			const [resource, operation] = key.split('.');
			const outputs = outputsFor({ resource, operation });
			assert.deepEqual(
				outputs,
				names.map((displayName) => ({ type: 'main', displayName })),
			);
		});
	}

	it('every other operation has a single main output', () => {
		const single = offered().filter((key) => !(key in EXPECTED_OUTPUTS));
		assert.deepEqual(single.sort(), [
			'effect.register',
			'operation.commit',
			'operation.fail',
			'operation.get',
			'operation.reconcile',
			'task.create',
			'task.get',
			'task.recordResult',
			'task.stop',
		]);
		for (const key of single) {
			const [resource, operation] = key.split('.');
			assert.deepEqual(outputsFor({ resource, operation }), ['main'], key);
		}
	});

	it('an unknown operation falls back to a single main output', () => {
		assert.deepEqual(outputsFor({ resource: 'task', operation: 'nope' }), ['main']);
		assert.deepEqual(outputsFor({}), ['main']);
	});

	it('execute returns as many outputs as the expression declares', async () => {
		for (const key of offered()) {
			const { out } = await run({ params: paramsFor(key), answers: [ok(ACCEPTED_ANSWER[key])] });
			assert.equal(out.length, outputsFor(paramsFor(key)).length, key);
		}
	});
});

describe('operations', () => {
	it('offers exactly the operations the tests cover', () => {
		assert.deepEqual(offered().sort(), Object.keys(MINIMAL_PARAMS).sort());
	});

	for (const key of offered()) {
		it(`${key} has an entry in execute`, async () => {
			const { ctx, out } = await run({
				params: paramsFor(key),
				answers: [ok(ACCEPTED_ANSWER[key])],
			});
			assert.equal(ctx.calls.length, 1);
			assert.ok(out.flat().length === 1);
		});
	}

	it('the default operation of each resource is one it offers', () => {
		for (const p of description.properties.filter((x) => x.name === 'operation')) {
			assert.ok(
				p.options.some((o) => o.value === p.default),
				`${p.displayOptions.show.resource}: ${p.default}`,
			);
		}
		const resource = description.properties.find((p) => p.name === 'resource');
		assert.ok(resource.options.some((o) => o.value === resource.default));
	});

	it('an operation it does not offer is refused before any call', async () => {
		const { ctx, error } = await runError({ params: { resource: 'task', operation: 'nope' } });
		assert.ok(error instanceof NodeOperationError);
		assert.equal(error.message, 'Unknown operation "task.nope"');
		assert.equal(ctx.calls.length, 0);
		const other = await runError({ params: { resource: 'nope', operation: 'get' } });
		assert.equal(other.error.message, 'Unknown operation "nope.get"');
	});

	it('every parameter an operation reads is shown for that operation', async () => {
		// A parameter read but not displayed would be fed its default forever.
		for (const key of offered()) {
			const [resource, operation] = key.split('.');
			const shown = new Set();
			for (const p of description.properties) {
				const show = p.displayOptions?.show;
				if (show?.resource && !show.resource.includes(resource)) continue;
				if (show?.operation && !show.operation.includes(operation)) continue;
				shown.add(p.name);
				if (p.type === 'collection') for (const o of p.options) shown.add(`${p.name}.${o.name}`);
			}
			const { ctx } = await run({ params: paramsFor(key), answers: [ok(ACCEPTED_ANSWER[key])] });
			for (const { name } of ctx.parameterReads)
				assert.ok(shown.has(name), `${key} reads "${name}"`);
		}
	});

	it('uses the loopStopApi credential and is not offered as an AI tool', () => {
		assert.deepEqual(description.credentials, [{ name: 'loopStopApi', required: true }]);
		assert.equal(description.name, 'loopStop');
		assert.equal(description.version, 1);
		// A tool returns only its first output: Deny/Drop/Refused would reach the model as nothing.
		assert.equal(description.usableAsTool, undefined);
		assert.deepEqual(description.inputs, ['main']);
	});
});

describe('credential', () => {
	const credential = new LoopStopApi();

	it('is named loopStopApi', () => {
		assert.equal(credential.name, 'loopStopApi');
	});

	it('sends the token as a bearer Authorization header', () => {
		assert.deepEqual(credential.authenticate, {
			type: 'generic',
			properties: { headers: { Authorization: '=Bearer {{$credentials?.token}}' } },
		});
	});

	it('tests with GET /v1/whoami against the credential base URL', () => {
		assert.deepEqual(credential.test.request, {
			baseURL: '={{$credentials?.baseUrl}}',
			url: '/v1/whoami',
			method: 'GET',
		});
	});

	it('has a base URL and a password-typed token', () => {
		const byName = Object.fromEntries(credential.properties.map((p) => [p.name, p]));
		assert.deepEqual(Object.keys(byName).sort(), ['baseUrl', 'token']);
		assert.equal(byName.baseUrl.type, 'string');
		assert.equal(byName.baseUrl.default, 'http://127.0.0.1:8765');
		assert.equal(byName.token.type, 'string');
		assert.equal(byName.token.typeOptions?.password, true);
	});
});

describe('icons', () => {
	it('the node and the credential point at the one copy of each icon, in dist/', () => {
		const built = {
			'dist/nodes/LoopStop': new LoopStop().description.icon,
			'dist/credentials': new LoopStopApi().icon,
		};
		const seen = new Set();
		for (const [dir, icon] of Object.entries(built)) {
			for (const ref of [icon.light, icon.dark]) {
				assert.match(ref, /^file:/);
				const file = resolve(dir, ref.slice('file:'.length));
				assert.ok(existsSync(file), `${ref} from ${dir} exists`);
				seen.add(file);
			}
		}
		assert.deepEqual([...seen].sort(), [
			resolve('dist/icons/loopstop.dark.svg'),
			resolve('dist/icons/loopstop.svg'),
		]);
	});
});
