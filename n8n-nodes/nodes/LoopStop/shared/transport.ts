import type { IDataObject, IExecuteFunctions, IHttpRequestOptions, JsonObject } from 'n8n-workflow';
import { NodeApiError } from 'n8n-workflow';
import { executionId } from './parameters';
import type { LoopStopRequest } from './types';

/** How long one call may take: the sidecar answers in milliseconds, a check in seconds. */
export const REQUEST_TIMEOUT_MS = 30_000;

interface FullResponse {
	statusCode: number;
	body: unknown;
}

function isObject(value: unknown): value is IDataObject {
	return typeof value === 'object' && value !== null && !Array.isArray(value);
}

/**
 * Send one request to the sidecar with the `loopStopApi` credential.
 *
 * Returns the JSON answer of a 2xx response. Any other status becomes a
 * `NodeApiError` carrying the problem details (RFC 9457) the sidecar sent:
 * `title` as the message, `detail` and the first invalid field as the
 * description, the HTTP status as `httpCode`. A network failure (sidecar down,
 * timeout) becomes a `NodeApiError` too; either way nothing was decided.
 *
 * Every request body carries `execution_id` (`$execution.id`) beside the
 * `workflow` and `execution_mode` the operation set, so that a chain or task
 * stop can reach the executions that acted for it.
 */
export async function loopStopRequest(
	this: IExecuteFunctions,
	request: LoopStopRequest,
	itemIndex: number,
): Promise<IDataObject> {
	const credentials = await this.getCredentials('loopStopApi', itemIndex);
	const baseUrl = String(credentials.baseUrl ?? '').replace(/\/+$/, '');
	const options: IHttpRequestOptions = {
		method: request.method,
		url: baseUrl + request.path,
		json: true,
		returnFullResponse: true,
		ignoreHttpStatusErrors: true,
		timeout: REQUEST_TIMEOUT_MS,
	};
	if (request.body !== undefined) {
		const id = executionId(this);
		options.body = id === undefined ? request.body : { ...request.body, execution_id: id };
	}
	if (request.qs !== undefined) options.qs = request.qs;

	let response: FullResponse;
	try {
		response = (await this.helpers.httpRequestWithAuthentication.call(
			this,
			'loopStopApi',
			options,
		)) as FullResponse;
	} catch (error) {
		// A plain object, not the caught NodeApiError: re-wrapping that one
		// would hand it back unchanged, without this message or the item.
		const cause = error as { message?: string; code?: string };
		throw new NodeApiError(
			this.getNode(),
			{ message: String(cause.message ?? 'request failed') } as JsonObject,
			{
				message: `Loop Stop sidecar unreachable at ${baseUrl}`,
				description: [cause.code, cause.message].filter(Boolean).join(': '),
				itemIndex,
			},
		);
	}
	if (response.statusCode >= 200 && response.statusCode < 300 && isObject(response.body)) {
		return response.body;
	}
	const problem: IDataObject = isObject(response.body) ? response.body : {};
	const errors = Array.isArray(problem.errors) ? (problem.errors as IDataObject[]) : [];
	const field =
		errors.length && Array.isArray(errors[0].loc) ? (errors[0].loc as string[]).join('.') : '';
	const detail = [problem.detail, field && `field: ${field} (${String(errors[0].msg ?? '')})`]
		.filter(Boolean)
		.join('; ');
	throw new NodeApiError(this.getNode(), problem as JsonObject, {
		message: String(problem.title ?? `Loop Stop sidecar answered ${response.statusCode}`),
		description: detail || undefined,
		httpCode: String(response.statusCode),
		itemIndex,
	});
}
