import type { INodeProperties } from 'n8n-workflow';
import { compact, json, segment } from '../../shared/parameters';
import type { LoopStopOperation } from '../../shared/types';

const show = { resource: ['operation'], operation: ['commit'] };

export const attemptField: INodeProperties = {
	displayName: 'Attempt',
	name: 'attempt',
	type: 'number',
	default: 0,
	required: true,
	placeholder: "e.g. {{ $('Begin').item.json.loopstop.operation.attempt }}",
	description: 'The attempt number the Begin answer gave; a stale attempt is refused',
};

export const commitDescription: INodeProperties[] = [
	{ ...attemptField, displayOptions: { show } },
	{
		displayName: 'Receipt',
		name: 'receipt',
		type: 'json',
		default: '={{ $json }}',
		required: true,
		description: 'What the receiver answered (such as the created record ID); a replay returns it',
		displayOptions: { show },
	},
];

/** `POST /v1/operations/{id}/commit`: the write happened; record its receipt. */
export const commit: LoopStopOperation = {
	request(i, flow) {
		return {
			method: 'POST',
			path: `/v1/operations/${segment(this, 'operationId', i)}/commit`,
			body: compact({
				// The operation lives in its workflow's namespace: name it on every route.
				workflow: flow.workflow,
				execution_mode: flow.executionMode,
				attempt: Number(this.getNodeParameter('attempt', i)),
				receipt: (json(this, 'receipt', i) ?? null) as never,
			}),
		};
	},
};
