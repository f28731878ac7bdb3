import type { INodeProperties } from 'n8n-workflow';
import { compact, options, text } from '../../shared/parameters';
import { additionalFields } from '../../shared/descriptions';
import type { LoopStopOperation } from '../../shared/types';

const show = { resource: ['task'], operation: ['create'] };

export const createDescription: INodeProperties[] = [
	{
		displayName: 'Task Key',
		name: 'taskKey',
		type: 'string',
		default: '',
		placeholder: 'e.g. ticket-{{ $json.ticket_id }}',
		description:
			'What the task is about. A re-activated flow with the same key continues the same task and its budgets.',
		displayOptions: { show },
	},
	additionalFields(show, [
		{
			displayName: 'Chain ID',
			name: 'chainId',
			type: 'string',
			default: '',
			description: 'The chain of the activation that started the task',
		},
		{
			displayName: 'Limits',
			name: 'limits',
			type: 'json',
			default: '{}',
			description:
				'Tighter limits for this task, such as {"max_tool_calls": 10, "max_same_call": 2}',
		},
		{
			displayName: 'Policy',
			name: 'policy',
			type: 'string',
			default: '',
			description: 'A named policy from the sidecar configuration',
		},
	]),
];

/** `POST /v1/tasks`: create a task, or continue the one with the same task key. */
export const create: LoopStopOperation = {
	request(i, flow) {
		return {
			method: 'POST',
			path: '/v1/tasks',
			body: compact({
				workflow: flow.workflow,
				execution_mode: flow.executionMode,
				task_key: text(this, 'taskKey', i),
				chain_id: text(this, 'additionalFields.chainId', i),
				policy: text(this, 'additionalFields.policy', i),
				limits: options(this, 'additionalFields.limits', i),
			}),
		};
	},
};
