import type { INodeProperties } from 'n8n-workflow';
import { compact, segment, text } from '../../shared/parameters';
import type { LoopStopOperation } from '../../shared/types';

const show = { resource: ['task'], operation: ['stop'] };

export const stopDescription: INodeProperties[] = [
	{
		displayName: 'Reason',
		name: 'reason',
		type: 'string',
		default: 'stopped from n8n',
		required: true,
		description: 'Why the task is stopped, shown to the agent and in the decision log',
		displayOptions: { show },
	},
];

/** `POST /v1/tasks/{id}/stop`: stop the task for good (`operator_stop`). */
export const stop: LoopStopOperation = {
	request(i, flow) {
		return {
			method: 'POST',
			path: `/v1/tasks/${segment(this, 'taskId', i)}/stop`,
			body: compact({
				execution_mode: flow.executionMode,
				reason: text(this, 'reason', i) ?? 'stopped',
			}),
		};
	},
};
