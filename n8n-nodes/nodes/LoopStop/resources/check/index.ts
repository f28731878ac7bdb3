import type { INodeProperties } from 'n8n-workflow';
import { runDescription } from './run';

export { run } from './run';

export const checkDescription: INodeProperties[] = [
	{
		displayName: 'Operation',
		name: 'operation',
		type: 'options',
		noDataExpression: true,
		displayOptions: { show: { resource: ['check'] } },
		options: [
			{
				name: 'Run',
				value: 'run',
				action: 'Run a check',
				description: 'Ask the system of record through a configured check: Pass or Fail',
			},
		],
		default: 'run',
	},
	...runDescription,
];
