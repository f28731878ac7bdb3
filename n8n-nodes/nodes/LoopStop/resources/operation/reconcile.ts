import type { INodeProperties } from 'n8n-workflow';
import { compact, json, segment } from '../../shared/parameters';
import type { LoopStopOperation } from '../../shared/types';

const show = { resource: ['operation'], operation: ['reconcile'] };

export const reconcileDescription: INodeProperties[] = [
	{
		displayName: 'Outcome',
		name: 'outcome',
		type: 'options',
		default: 'committed',
		options: [
			{
				name: 'Committed',
				value: 'committed',
				description: 'The receiver has the write: later Begins replay it',
			},
			{
				name: 'Not Committed',
				value: 'not_committed',
				description: 'The receiver does not have it: a later Begin may execute again',
			},
		],
		description: 'What asking the receiver established',
		displayOptions: { show },
	},
	{
		displayName: 'Evidence',
		name: 'evidence',
		type: 'json',
		default: '={{ $json }}',
		required: true,
		description: 'What the receiver answered when asked, kept with the record',
		displayOptions: { show },
	},
	{
		displayName: 'Receipt',
		name: 'receipt',
		type: 'json',
		default: '',
		description: 'The receipt to replay when the outcome is Committed',
		displayOptions: { show },
	},
];

/** `POST /v1/operations/{id}/reconcile`: settle an unknown outcome with evidence. */
export const reconcile: LoopStopOperation = {
	request(i, flow) {
		return {
			method: 'POST',
			path: `/v1/operations/${segment(this, 'operationId', i)}/reconcile`,
			body: compact({
				// The operation lives in its workflow's namespace: name it on every route.
				workflow: flow.workflow,
				execution_mode: flow.executionMode,
				outcome: String(this.getNodeParameter('outcome', i)),
				evidence: (json(this, 'evidence', i) ?? null) as never,
				receipt: json(this, 'receipt', i) as never,
			}),
		};
	},
};
