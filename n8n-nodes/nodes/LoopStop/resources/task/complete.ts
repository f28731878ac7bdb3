import type { INodeProperties } from 'n8n-workflow';
import { compact, json, options, segment, text } from '../../shared/parameters';
import { additionalFields } from '../../shared/descriptions';
import type { LoopStopOperation } from '../../shared/types';

const show = { resource: ['task'], operation: ['complete'] };

export const completeDescription: INodeProperties[] = [
	{
		displayName: 'Check',
		name: 'check',
		type: 'string',
		default: '',
		placeholder: 'e.g. refund_issued',
		description: 'A configured check that asks the system of record whether the task is done',
		displayOptions: { show },
	},
	{
		displayName: 'Check Input',
		name: 'input',
		type: 'json',
		default: '',
		description: 'The input of the check, such as the ticket ID to look up',
		displayOptions: { show },
	},
	additionalFields(show, [
		{
			displayName: 'Evidence',
			name: 'evidence',
			type: 'json',
			default: '{}',
			description: 'Trusted evidence instead of a check: {"done": true, "revision": 12}',
		},
	]),
];

/**
 * `POST /v1/tasks/{id}/complete`: Done when the check passes, Continue when it
 * does not (the task goes on), Ended when the task already ended.
 */
export const complete: LoopStopOperation = {
	outputs: ['Done', 'Continue', 'Ended'],
	errorOutput: 'Continue',
	request(i, flow) {
		return {
			method: 'POST',
			path: `/v1/tasks/${segment(this, 'taskId', i)}/complete`,
			body: compact({
				execution_mode: flow.executionMode,
				check: text(this, 'check', i),
				input: json(this, 'input', i) as never,
				evidence: options(this, 'additionalFields.evidence', i),
			}),
		};
	},
	route(answer) {
		return { completed: 'Done', continue: 'Continue', ended: 'Ended' }[String(answer.decision)];
	},
};
