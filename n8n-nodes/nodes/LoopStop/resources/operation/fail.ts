import type { INodeProperties } from 'n8n-workflow';
import { compact, segment, text } from '../../shared/parameters';
import type { LoopStopOperation } from '../../shared/types';
import { attemptField } from './commit';

const show = { resource: ['operation'], operation: ['fail'] };

export const failDescription: INodeProperties[] = [
	{ ...attemptField, displayOptions: { show } },
	{
		displayName: 'Outcome',
		name: 'outcome',
		type: 'options',
		default: 'unknown',
		options: [
			{
				name: 'Not Committed',
				value: 'not_committed',
				description: 'The receiver refused the write: a later Begin may execute again',
			},
			{
				name: 'Unknown',
				value: 'unknown',
				description: 'A timeout or a dropped connection: the write may have happened; reconcile it',
			},
		],
		description: 'What is known about the write',
		displayOptions: { show },
	},
	{
		displayName: 'Detail',
		name: 'detail',
		type: 'string',
		default: '',
		description: 'A short reason for the decision log, such as the error message',
		displayOptions: { show },
	},
];

/** `POST /v1/operations/{id}/fail`: the attempt failed, `not_committed` or `unknown`. */
export const fail: LoopStopOperation = {
	request(i, flow) {
		const detail = text(this, 'detail', i);
		return {
			method: 'POST',
			path: `/v1/operations/${segment(this, 'operationId', i)}/fail`,
			body: compact({
				// The operation lives in its workflow's namespace: name it on every route.
				workflow: flow.workflow,
				execution_mode: flow.executionMode,
				attempt: Number(this.getNodeParameter('attempt', i)),
				outcome: String(this.getNodeParameter('outcome', i)),
				detail: detail?.slice(0, 2000),
			}),
		};
	},
};
