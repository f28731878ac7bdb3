import type { INodeProperties } from 'n8n-workflow';
import { admitToolCallDescription } from './admitToolCall';
import { completeDescription } from './complete';
import { createDescription } from './create';
import { recordResultDescription } from './recordResult';
import { stopDescription } from './stop';

export { admitToolCall } from './admitToolCall';
export { complete } from './complete';
export { create } from './create';
export { get } from './get';
export { recordResult } from './recordResult';
export { stop } from './stop';

export const taskDescription: INodeProperties[] = [
	{
		displayName: 'Operation',
		name: 'operation',
		type: 'options',
		noDataExpression: true,
		displayOptions: { show: { resource: ['task'] } },
		options: [
			{
				name: 'Admit Tool Call',
				value: 'admitToolCall',
				action: 'Admit a tool call',
				description: 'Before a tool acts: Execute, Replay a write, or Deny',
			},
			{
				name: 'Complete',
				value: 'complete',
				action: 'Complete a task',
				description:
					'Accept the agent’s answer only when a check confirms it: Done, Continue or Ended',
			},
			{
				name: 'Create',
				value: 'create',
				action: 'Create a task',
				description: 'Start a task with budgets shared by every execution that works on it',
			},
			{
				name: 'Get',
				value: 'get',
				action: 'Get a task',
				description: 'Read a task, its counters and its envelope',
			},
			{
				name: 'Record Result',
				value: 'recordResult',
				action: 'Record a tool result',
				description: 'After a tool acted: record how it ended',
			},
			{
				name: 'Stop',
				value: 'stop',
				action: 'Stop a task',
				description: 'Stop the task: every later tool call and model turn is denied',
			},
		],
		default: 'create',
	},
	{
		displayName: 'Task ID',
		name: 'taskId',
		type: 'string',
		default: '',
		required: true,
		placeholder: "e.g. {{ $('Create Task').item.json.loopstop.task.task_id }}",
		description: 'The task ID the Create answer gave',
		displayOptions: {
			show: {
				resource: ['task'],
				operation: ['admitToolCall', 'recordResult', 'complete', 'stop', 'get'],
			},
		},
	},
	...createDescription,
	...admitToolCallDescription,
	...recordResultDescription,
	...completeDescription,
	...stopDescription,
];
