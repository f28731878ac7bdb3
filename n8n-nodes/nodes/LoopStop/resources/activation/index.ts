import type { INodeProperties } from 'n8n-workflow';
import { checkTriggerDescription } from './checkTrigger';

export { checkTrigger } from './checkTrigger';

export const activationDescription: INodeProperties[] = [
	{
		displayName: 'Operation',
		name: 'operation',
		type: 'options',
		noDataExpression: true,
		displayOptions: { show: { resource: ['activation'] } },
		options: [
			{
				name: 'Check Trigger',
				value: 'checkTrigger',
				action: 'Check a trigger event',
				description:
					'Right after a trigger: proceed, or drop the echo of this workflow’s own write, a duplicate, or a chain that went too deep',
			},
		],
		default: 'checkTrigger',
	},
	...checkTriggerDescription,
];
