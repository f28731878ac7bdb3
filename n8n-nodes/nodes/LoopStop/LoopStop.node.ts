import type {
	IDataObject,
	IExecuteFunctions,
	INodeExecutionData,
	INodeType,
	INodeTypeDescription,
	JsonObject,
} from 'n8n-workflow';
import { NodeApiError, NodeConnectionTypes, NodeOperationError } from 'n8n-workflow';
import {
	activationDescription,
	checkDescription,
	effectDescription,
	OPERATIONS,
	OUTPUT_NAMES,
	operationDescription,
	taskDescription,
} from './resources';
import { flowContext } from './shared/parameters';
import { loopStopRequest } from './shared/transport';

/** The field of each output item that holds the sidecar's answer. */
export const ANSWER_FIELD = 'loopstop';

/**
 * The node's outputs as an n8n expression over `$parameter`: the branching
 * operations get one named output per decision, the others a single output.
 */
const outputsExpression = `={{((p) => { const names = (${JSON.stringify(
	OUTPUT_NAMES,
)})[p.resource + '.' + p.operation]; return names ? names.map((n) => ({ type: 'main', displayName: n })) : ['main']; })($parameter)}}` as `={{${string}}}`;

// Not usable as an AI tool: a tool returns only its first output, so Deny,
// Drop and Refused would reach the model as nothing, and a model must not be
// the one that commits, reconciles or records evidence.
// eslint-disable-next-line @n8n/community-nodes/node-usable-as-tool
export class LoopStop implements INodeType {
	description: INodeTypeDescription = {
		displayName: 'Loop Stop',
		name: 'loopStop',
		icon: { light: 'file:../../icons/loopstop.svg', dark: 'file:../../icons/loopstop.dark.svg' },
		group: ['transform'],
		version: 1,
		subtitle: '={{$parameter["operation"] + ": " + $parameter["resource"]}}',
		description:
			'Stop automation loops: drop trigger echoes, run each write once, keep AI Agents inside their budgets',
		defaults: {
			name: 'Loop Stop',
		},
		inputs: [NodeConnectionTypes.Main],
		outputs: outputsExpression,
		credentials: [
			{
				name: 'loopStopApi',
				required: true,
			},
		],
		properties: [
			{
				displayName: 'Resource',
				name: 'resource',
				type: 'options',
				noDataExpression: true,
				options: [
					{ name: 'Activation', value: 'activation' },
					{ name: 'Check', value: 'check' },
					{ name: 'Effect', value: 'effect' },
					{ name: 'Operation', value: 'operation' },
					{ name: 'Task', value: 'task' },
				],
				default: 'activation',
			},
			...activationDescription,
			...effectDescription,
			...operationDescription,
			...taskDescription,
			...checkDescription,
		],
	};

	/**
	 * Call the sidecar once per item and send each item, with the answer under
	 * `loopstop`, to the output its decision names. An answer whose decision
	 * this version does not know is an error, never a branch that acts. Under
	 * Continue On Fail an item's error goes to the operation's non-acting
	 * output (Drop, Refused, Deny, Continue, Fail).
	 */
	async execute(this: IExecuteFunctions): Promise<INodeExecutionData[][]> {
		const items = this.getInputData();
		const resource = this.getNodeParameter('resource', 0) as string;
		const name = this.getNodeParameter('operation', 0) as string;
		const op = OPERATIONS[resource]?.[name];
		if (!op) {
			throw new NodeOperationError(this.getNode(), `Unknown operation "${resource}.${name}"`);
		}
		const outputNames = op.outputs ?? ['main'];
		const out: INodeExecutionData[][] = outputNames.map(() => []);
		const flow = flowContext(this);

		for (let i = 0; i < items.length; i++) {
			try {
				const answer = await loopStopRequest.call(this, op.request.call(this, i, flow), i);
				const target = op.route ? op.route(answer) : 'main';
				const index = target === undefined ? -1 : outputNames.indexOf(target);
				if (index < 0) {
					throw new NodeOperationError(
						this.getNode(),
						`The sidecar answered a decision this node does not know: ${JSON.stringify(answer.decision ?? answer.passed)}`,
						{ itemIndex: i, description: 'Update n8n-nodes-loopstop to match the sidecar.' },
					);
				}
				out[index].push({
					json: { ...items[i].json, [ANSWER_FIELD]: answer as IDataObject },
					pairedItem: { item: i },
				});
			} catch (error) {
				if (this.continueOnFail()) {
					const index = Math.max(0, outputNames.indexOf(op.errorOutput ?? 'main'));
					out[index].push({
						json: { ...items[i].json, error: (error as Error).message },
						error,
						pairedItem: { item: i },
					});
					continue;
				}
				if (error instanceof NodeApiError) {
					throw new NodeApiError(this.getNode(), error as unknown as JsonObject, { itemIndex: i });
				}
				throw new NodeOperationError(this.getNode(), error as Error, { itemIndex: i });
			}
		}
		return out;
	}
}
