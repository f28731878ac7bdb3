import type { IDataObject, IExecuteFunctions } from 'n8n-workflow';
import { NodeOperationError } from 'n8n-workflow';
import type { FlowContext } from './types';

/** `$workflow.id` and `$execution.mode` as the sidecar wants them. */
export function flowContext(ctx: IExecuteFunctions): FlowContext {
	return {
		workflow: String(ctx.getWorkflow().id ?? ''),
		executionMode: ctx.getMode() === 'manual' ? 'test' : 'production',
	};
}

/** A path segment: encoded so that an id can never change the route. */
export function segment(ctx: IExecuteFunctions, name: string, itemIndex: number): string {
	const value = String(ctx.getNodeParameter(name, itemIndex, '') ?? '').trim();
	if (!value) {
		throw new NodeOperationError(ctx.getNode(), `The parameter "${name}" is empty`, { itemIndex });
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

/**
 * A JSON parameter: an object, array or scalar an expression produced, or a
 * string holding JSON. An empty string is `undefined`.
 *
 * @throws NodeOperationError naming the parameter when the string is not JSON.
 */
export function json(ctx: IExecuteFunctions, name: string, itemIndex: number): unknown {
	const value = ctx.getNodeParameter(name, itemIndex, '');
	if (typeof value !== 'string') return value;
	if (!value.trim()) return undefined;
	try {
		return JSON.parse(value);
	} catch {
		throw new NodeOperationError(ctx.getNode(), `The parameter "${name}" is not valid JSON`, {
			itemIndex,
		});
	}
}

/**
 * A list of keys: an array from an expression, or a string of keys separated
 * by commas, spaces or new lines (a Gmail `References` header as it comes).
 */
export function keys(
	ctx: IExecuteFunctions,
	name: string,
	itemIndex: number,
): string[] | undefined {
	const value = ctx.getNodeParameter(name, itemIndex, '') as unknown;
	const list = Array.isArray(value)
		? value.map((v) => String(v).trim())
		: String(value ?? '')
				.split(/[\s,]+/)
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
