import type { INodeProperties } from 'n8n-workflow';
import { beginDescription } from './begin';
import { commitDescription } from './commit';
import { failDescription } from './fail';
import { reconcileDescription } from './reconcile';

export { begin } from './begin';
export { commit } from './commit';
export { fail } from './fail';
export { get } from './get';
export { reconcile } from './reconcile';

export const operationDescription: INodeProperties[] = [
	{
		displayName: 'Operation',
		name: 'operation',
		type: 'options',
		noDataExpression: true,
		displayOptions: { show: { resource: ['operation'] } },
		options: [
			{
				name: 'Begin',
				value: 'begin',
				action: 'Begin a write',
				description:
					'Before a write: Execute it, Replay its receipt, Wait, Reconcile an unknown outcome, or Refused',
			},
			{
				name: 'Commit',
				value: 'commit',
				action: 'Commit a write',
				description: 'After the write succeeded: record its receipt',
			},
			{
				name: 'Fail',
				value: 'fail',
				action: 'Fail a write',
				description: 'After the write failed: not committed, or unknown after a timeout',
			},
			{
				name: 'Get',
				value: 'get',
				action: 'Get an operation',
				description: 'Read the record of a write',
			},
			{
				name: 'Reconcile',
				value: 'reconcile',
				action: 'Reconcile a write',
				description: 'Settle an unknown outcome with what the receiver says',
			},
		],
		default: 'begin',
	},
	{
		displayName: 'Operation ID',
		name: 'operationId',
		type: 'string',
		default: '',
		required: true,
		placeholder: 'e.g. crm-create-order-{{ $json.order_id }}',
		description:
			'The idempotency key of the business operation: the same for every retry and re-run of the same write',
		displayOptions: { show: { resource: ['operation'] } },
	},
	...beginDescription,
	...commitDescription,
	...failDescription,
	...reconcileDescription,
];
