import type { INodeProperties } from 'n8n-workflow';
import { compact, json, positive, segment, text } from '../../shared/parameters';
import { additionalFields } from '../../shared/descriptions';
import type { LoopStopOperation } from '../../shared/types';

const show = { resource: ['operation'], operation: ['begin'] };

export const beginDescription: INodeProperties[] = [
	{
		displayName: 'Payload',
		name: 'payload',
		type: 'json',
		default: '={{ $json.body ?? $json }}',
		required: true,
		description:
			'What the write will send (default: a webhook’s body, else the item). The same operation ID with another payload is refused as a conflict.',
		displayOptions: { show },
	},
	additionalFields(show, [
		{
			displayName: 'Chain ID',
			name: 'chainId',
			type: 'string',
			default: '',
			description: 'The chain this write belongs to; a stopped chain refuses it',
		},
		{
			displayName: 'Lease (Seconds)',
			name: 'leaseS',
			type: 'number',
			default: 0,
			description:
				'How long the write may take before its outcome counts as unknown (default: the configured lease)',
		},
		{
			displayName: 'Reconcile Check',
			name: 'reconcileCheck',
			type: 'string',
			default: '',
			description:
				'A configured check that asks the receiver whether an unknown write happened, run by the next Begin',
		},
		{
			displayName: 'Reconcile Input',
			name: 'reconcileInput',
			type: 'json',
			default: '',
			description: 'The input of the reconcile check, such as the order ID to look up',
		},
		{
			displayName: 'Task ID',
			name: 'taskId',
			type: 'string',
			default: '',
			description: 'The task this write belongs to; a stopped task refuses it',
		},
	]),
];

/**
 * `POST /v1/operations/{id}/begin`: reserve the write before doing it.
 *
 * Execute: do the write now, then Commit or Fail with the answer's attempt.
 * Replay: it already happened; the answer carries the receipt. Wait: another
 * attempt holds the lease (`in_progress`). Reconcile: the outcome is unknown;
 * ask the receiver, then Reconcile. Refused: `conflict`, `stopped`,
 * `exhausted`.
 */
export const begin: LoopStopOperation = {
	outputs: ['Execute', 'Replay', 'Wait', 'Reconcile', 'Refused'],
	errorOutput: 'Refused',
	request(i, flow) {
		const check = text(this, 'additionalFields.reconcileCheck', i);
		return {
			method: 'POST',
			path: `/v1/operations/${segment(this, 'operationId', i)}/begin`,
			body: compact({
				workflow: flow.workflow,
				execution_mode: flow.executionMode,
				payload: (json(this, 'payload', i) ?? null) as never,
				task_id: text(this, 'additionalFields.taskId', i),
				chain_id: text(this, 'additionalFields.chainId', i),
				lease_s: positive(this, 'additionalFields.leaseS', i),
				reconcile: check
					? compact({ check, input: json(this, 'additionalFields.reconcileInput', i) as never })
					: undefined,
			}),
		};
	},
	route(answer) {
		return {
			execute: 'Execute',
			replay: 'Replay',
			in_progress: 'Wait',
			reconcile: 'Reconcile',
			conflict: 'Refused',
			stopped: 'Refused',
			exhausted: 'Refused',
		}[String(answer.decision)];
	},
};
