import type { INodeProperties } from 'n8n-workflow';
import { registerDescription } from './register';

export { register } from './register';

export const effectDescription: INodeProperties[] = [
	{
		displayName: 'Operation',
		name: 'operation',
		type: 'options',
		noDataExpression: true,
		displayOptions: { show: { resource: ['effect'] } },
		options: [
			{
				name: 'Register',
				value: 'register',
				action: 'Register a write',
				description:
					'After a write: remember it, so that the trigger it fires is dropped as an echo',
			},
		],
		default: 'register',
	},
	...registerDescription,
];
