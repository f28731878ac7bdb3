import type { INodeProperties } from 'n8n-workflow';
import { compact, json, segment, text } from '../../shared/parameters';
import { additionalFields } from '../../shared/descriptions';
import type { LoopStopOperation } from '../../shared/types';

const show = { resource: ['check'], operation: ['run'] };

export const runDescription: INodeProperties[] = [
	{
		displayName: 'Check',
		name: 'checkName',
		type: 'string',
		default: '',
		required: true,
		placeholder: 'e.g. refund_issued',
		description: 'The name of a check in the sidecar configuration',
		displayOptions: { show },
	},
	{
		displayName: 'Input',
		name: 'input',
		type: 'json',
		default: '={{ $json }}',
		description: 'The input of the check',
		displayOptions: { show },
	},
	additionalFields(show, [
		{
			displayName: 'Task ID',
			name: 'taskId',
			type: 'string',
			default: '',
			description: 'The task the check is about, for the decision log',
		},
	]),
];

/** `POST /v1/checks/{name}`: Pass only when the system of record confirms; a failing check never passes. */
export const run: LoopStopOperation = {
	outputs: ['Pass', 'Fail'],
	errorOutput: 'Fail',
	request(i, flow) {
		return {
			method: 'POST',
			path: `/v1/checks/${segment(this, 'checkName', i)}`,
			body: compact({
				execution_mode: flow.executionMode,
				input: json(this, 'input', i) as never,
				task_id: text(this, 'additionalFields.taskId', i),
			}),
		};
	},
	route(answer) {
		if (answer.passed === true) return 'Pass';
		if (answer.passed === false) return 'Fail';
		return undefined;
	},
};
