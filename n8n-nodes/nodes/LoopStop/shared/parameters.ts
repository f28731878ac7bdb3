import type { IDataObject, IExecuteFunctions } from 'n8n-workflow';
import { NodeOperationError } from 'n8n-workflow';
import type { FlowContext } from './types';

/** An execution id as the sidecar accepts it (n8n's are decimal strings). */
const EXECUTION_ID = /^[A-Za-z0-9_-]{1,64}$/;

/**
 * `$execution.id`, or `undefined` when n8n gives none the sidecar accepts.
 * The sidecar remembers which executions acted for a chain or a task, so that
 * a stop can ask n8n to stop them.
 */
export function executionId(ctx: IExecuteFunctions): string | undefined {
	const id = String(ctx.getExecutionId?.() ?? '');
	return EXECUTION_ID.test(id) ? id : undefined;
}

/** `$workflow.id`, `$execution.mode` and `$execution.id` as the sidecar wants them. */
export function flowContext(ctx: IExecuteFunctions): FlowContext {
	return {
		workflow: String(ctx.getWorkflow().id ?? ''),
		executionMode: ctx.getMode() === 'manual' ? 'test' : 'production',
		executionId: executionId(ctx),
	};
}

/**
 * A path segment: encoded so that an id can never change the route.
 *
 * @throws NodeOperationError when the value is empty, `.` or `..` (which a URL resolves away).
 */
export function segment(ctx: IExecuteFunctions, name: string, itemIndex: number): string {
	const value = String(ctx.getNodeParameter(name, itemIndex, '') ?? '').trim();
	if (!value || value === '.' || value === '..') {
		throw new NodeOperationError(ctx.getNode(), `The parameter "${name}" is empty or not an ID`, {
			itemIndex,
		});
	}
	return encodeURIComponent(value);
}

/** A string parameter, or `undefined` when it is empty. */
export function text(ctx: IExecuteFunctions, name: string, itemIndex: number): string | undefined {
	const value = ctx.getNodeParameter(name, itemIndex, '');
	if (value === undefined || value === null) return undefined;
	const s = String(value).trim();
	return s ? s : undefined;
}

/** A number parameter, or `undefined` when it is empty or 0 where 0 means "not set". */
export function positive(
	ctx: IExecuteFunctions,
	name: string,
	itemIndex: number,
): number | undefined {
	const value = Number(ctx.getNodeParameter(name, itemIndex, 0));
	return Number.isFinite(value) && value > 0 ? value : undefined;
}

/** The parameter as typed (before expressions are resolved), by dotted path. */
function raw(ctx: IExecuteFunctions, name: string): unknown {
	let value: unknown = ctx.getNode().parameters;
	for (const part of name.split('.')) {
		value =
			value && typeof value === 'object' ? (value as Record<string, unknown>)[part] : undefined;
	}
	return value;
}

/**
 * A JSON parameter: an object, array or scalar an expression produced, or a
 * string holding JSON. An empty string is `undefined`. A string an expression
 * produced that is not JSON (`{{ $json.order_id }}` giving `A-100`) stays a
 * string.
 *
 * @throws NodeOperationError naming the parameter when typed text is not JSON.
 */
export function json(ctx: IExecuteFunctions, name: string, itemIndex: number): unknown {
	const value = ctx.getNodeParameter(name, itemIndex, '');
	if (typeof value !== 'string') return value;
	if (!value.trim()) return undefined;
	try {
		return JSON.parse(value);
	} catch {
		const typed = raw(ctx, name);
		if (typeof typed === 'string' && typed.startsWith('=')) return value;
		throw new NodeOperationError(ctx.getNode(), `The parameter "${name}" is not valid JSON`, {
			itemIndex,
		});
	}
}

/**
 * An optional JSON object parameter (limits, evidence): `undefined` when it
 * is empty or `{}`, so that the request leaves the field out.
 */
export function options(
	ctx: IExecuteFunctions,
	name: string,
	itemIndex: number,
): IDataObject | undefined {
	const value = json(ctx, name, itemIndex) as IDataObject | undefined;
	return value && typeof value === 'object' && Object.keys(value).length ? value : undefined;
}

/**
 * A list of keys: an array from an expression, or a string of keys one per
 * line (a key may hold spaces, such as a sheet name; commas separate too).
 */
export function keys(
	ctx: IExecuteFunctions,
	name: string,
	itemIndex: number,
): string[] | undefined {
	const value = ctx.getNodeParameter(name, itemIndex, '') as unknown;
	const list = Array.isArray(value)
		? value.map((v) => String(v ?? '').trim())
		: String(value ?? '')
				.split(/[\r\n,]+/)
				.map((v) => v.trim());
	const kept = list.filter(Boolean);
	return kept.length ? kept : undefined;
}

/** `body` without the entries whose value is `undefined`. */
export function compact(body: IDataObject): IDataObject {
	const out: IDataObject = {};
	for (const [k, v] of Object.entries(body)) if (v !== undefined) out[k] = v as IDataObject[string];
	return out;
}
